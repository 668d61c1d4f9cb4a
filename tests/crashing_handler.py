"""A handler module that crashes its process on import while the file named by
TEST_CRASH_ON_IMPORT exists (RICOCHET_HANDLER=tests.crashing_handler:handle); once the file is
gone it imports, and its handler is tests.handlers.fault."""

import os
from pathlib import Path

from tests.handlers import fault as handle

if Path(os.environ["TEST_CRASH_ON_IMPORT"]).exists():
    raise RuntimeError("cannot start: a dependency of the handler is missing")

__all__ = ["handle"]
