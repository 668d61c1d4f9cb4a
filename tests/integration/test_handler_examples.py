"""docs/handlers.md's example (docs/examples/invoices.py), run as it stands: each of its types
ends as the page says."""

import importlib
import json

from aio_pika.abc import AbstractChannel

from tests.support import StartWorker, publish, take, wait_for


async def test_the_handlers_page_example_runs(
    start_worker: StartWorker, channel: AbstractChannel, queue_name: str
) -> None:
    """An invoice with an address is sent once, keyed on the invoice; one without goes to the
    failed queue as permanent; the sync cache job runs; an unknown report fails at once, its
    KeyError a LookupError that the type gives up on."""
    invoices = importlib.import_module("docs.examples.invoices")
    worker = await start_worker(invoices.router)
    jobs = {
        "sent": ("invoice.send", {"invoice_id": 7, "email": "ada@example.com"}),
        "no-address": ("invoice.send", {"invoice_id": 8, "email": ""}),
        "warm": ("cache.warm", {"keys": ["a", "b"]}),
        "report": ("report.build", {"report_id": "r-1"}),
        "no-report": ("report.build", {"report_id": "r-9"}),
    }
    for message_id, (job_type, payload) in jobs.items():
        await publish(
            channel, queue_name, json.dumps(payload), message_id=message_id, type=job_type
        )
    await wait_for(lambda: worker.count("succeeded") == 3, 20, "the three jobs that succeed")
    failed = await take(channel, f"{queue_name}.failed", 2)
    assert {copy.message_id: copy.headers["failed-kind"] for copy in failed} == {
        "no-address": "permanent",
        "no-report": "permanent",
    }
    assert invoices.SENT == {"invoice-7": "ada@example.com: invoice 7"}
    assert invoices.CACHE == {"a": "A", "b": "B"}
