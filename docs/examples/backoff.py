# backoff.py  ->  RICOCHET_HANDLER=backoff:router
# Each job type retries on a ladder of its own: 3 attempts in all, waiting longer for slower
# dependencies. The waits are held by RabbitMQ, like every wait.
from ricochet import Job, Router, exponential

router = Router()


@router.handler("email.send", retry_delays_ms=exponential(5_000, 2))  # 5 s, 10 s
async def send_email(job: Job) -> None: ...


@router.handler("oauth.refresh", retry_delays_ms=exponential(60_000, 2))  # 60 s, 120 s
async def refresh_token(job: Job) -> None: ...


@router.handler("embeddings", retry_delays_ms=exponential(2_000, 2), timeout_s=120)  # 2 s, 4 s
async def embed(job: Job) -> None: ...
