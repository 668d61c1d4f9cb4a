"""A handler, and the enqueue that gives it a job. Run it: RICOCHET_HANDLER=welcome:router."""

from pydantic import BaseModel
from ricochet import Client, Job, PermanentError, Router

router = Router()


class Welcome(BaseModel):
    user_id: int
    email: str


@router.handler("welcome.send", model=Welcome)
async def send_welcome(job: Job, welcome: Welcome) -> None:
    if "@" not in welcome.email:
        raise PermanentError("no address: retrying cannot help")  # to the failed queue at once
    # Send the email here, keyed on job.message_id (the same on every attempt). Any other
    # exception retries the job with backoff, held by RabbitMQ.


async def sign_up(user_id: int, email: str) -> str:
    async with Client() as jobs:  # RICOCHET_AMQP_URL and RICOCHET_QUEUE from the environment
        return await jobs.enqueue(
            "welcome.send",
            {"user_id": user_id, "email": email},
            message_id=f"welcome-{user_id}",  # one welcome per user, however often it is asked
        )  # returns once the broker has confirmed the job
