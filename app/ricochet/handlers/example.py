"""The bundled example handler: a report job that can be told to fail.

Publish one and watch it walk the retry ladder:

    ricochet publish --type report '{"report_id": "r-1", "fail_times": 2}'
    ricochet publish --type report '{"report_id": "r-2", "fail": "permanent"}'
"""

import asyncio
from typing import Literal

from pydantic import BaseModel, Field

from ricochet.errors import PermanentError
from ricochet.handlers.job import Job
from ricochet.handlers.router import Router
from ricochet.log import get_logger

log = get_logger("ricochet.example")
router = Router()


class ReportRequest(BaseModel):
    """A report to build; the other fields make it misbehave on purpose."""

    report_id: str
    fail_times: int = Field(0, ge=0, description="fail transiently on the first N attempts")
    fail: Literal["never", "always", "permanent"] = "never"
    work_s: float = Field(0.0, ge=0, le=3600, description="pretend to work this long")


class ReportBackendDown(Exception):
    """The (pretend) reporting backend did not answer: worth retrying."""


@router.handler("report", model=ReportRequest)
async def build_report(job: Job, request: ReportRequest) -> None:
    """Build a report, or fail the way the payload asks."""
    await asyncio.sleep(request.work_s)
    if request.fail == "permanent":
        raise PermanentError(f"report {request.report_id} cannot be built: unknown customer")
    if request.fail == "always" or job.attempt <= request.fail_times:
        raise ReportBackendDown(f"report backend timed out for report {request.report_id}")
    log.info("report built", report_id=request.report_id)
