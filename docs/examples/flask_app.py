"""Enqueueing from Flask (or Django): one SyncClient per process, shared by its threads."""

from flask import Flask
from ricochet import SyncClient

# Connects at its first enqueue, in the process that makes it: safe under gunicorn --preload
# and uWSGI, whose workers are forked after this module is imported.
jobs = SyncClient()  # RICOCHET_AMQP_URL and RICOCHET_QUEUE from the environment

app = Flask(__name__)


@app.post("/reports/<report_id>")
def build_report(report_id: str) -> tuple[dict[str, str], int]:
    message_id = jobs.enqueue("report", {"report_id": report_id}, delay=60)  # in a minute
    return {"job": message_id}, 202
