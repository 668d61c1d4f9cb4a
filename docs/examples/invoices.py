"""Three job types and the ways a job ends. Run it: RICOCHET_HANDLER=invoices:router."""

from pydantic import BaseModel
from ricochet import Job, PermanentError, Router

router = Router()
SENT: dict[str, str] = {}  # stands in for your mail provider
CACHE: dict[str, str] = {}
REPORTS = {"r-1": "the first report"}


class Invoice(BaseModel):
    invoice_id: int
    email: str


async def send_email(to: str, text: str, idempotency_key: str) -> None:
    """Your mail provider's client: with the key, a send retried after a crash sends once."""
    SENT.setdefault(idempotency_key, f"{to}: {text}")


@router.handler("invoice.send", model=Invoice)
async def send_invoice(job: Job, invoice: Invoice) -> None:
    if not invoice.email:
        raise PermanentError("no address: retrying cannot help")  # to the failed queue at once
    text = f"invoice {invoice.invoice_id}"
    await send_email(invoice.email, text, idempotency_key=f"invoice-{invoice.invoice_id}")
    # Any other exception is retried with backoff.


@router.handler("cache.warm")
def warm_cache(job: Job) -> None:  # sync handlers run in a worker thread
    for key in job.payload["keys"]:
        CACHE[key] = key.upper()


@router.handler("report.build", max_retries=1, give_up_on=(LookupError,))
def build_report(job: Job) -> None:  # one retry; an unknown report (KeyError) fails at once
    print(REPORTS[job.payload["report_id"]])
