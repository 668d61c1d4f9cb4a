"""Enqueueing from FastAPI: one Client for the app's lifetime, opened and closed by its lifespan."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from ricochet import Client


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with Client() as jobs:  # RICOCHET_AMQP_URL and RICOCHET_QUEUE from the environment
        app.state.jobs = jobs
        yield  # closing waits for the confirms of enqueues still in flight


app = FastAPI(lifespan=lifespan)


@app.post("/invoices/{invoice_id}/send", status_code=202)
async def send_invoice(invoice_id: int, request: Request) -> dict[str, str]:
    jobs: Client = request.app.state.jobs
    message_id = await jobs.enqueue(
        "invoice.send",
        {"invoice_id": invoice_id},
        message_id=f"invoice-{invoice_id}-send",  # one job per invoice, however often it is asked
        max_retries=5,
    )
    return {"job": message_id}  # the broker has confirmed it
