"""Your first handler. Run it from this file's folder:
RICOCHET_HANDLER=greetings:router ricochet worker"""

from ricochet import Job, PermanentError, Router

router = Router()


@router.handler("greet")
def greet(job: Job) -> None:
    name = job.payload.get("name")
    if not name:
        raise PermanentError("no name to greet: retrying cannot help")  # to the failed queue
    print(f"Hello, {name}! (attempt {job.attempt} of job {job.message_id})", flush=True)
