"""The journal's views on the monitor (SPEC 26): its index of the journal, read from what was
written before it started and kept up to date after, served as GET /api/jobs, /api/jobs/<id>,
/jobs and /jobs/<id>, results only with the console token, and asked by `ricochet job` when
RICOCHET_MONITOR_URL is set."""

import asyncio
import json
from typing import Any

import aiohttp
from ricochet import Client, Job, Router

from tests.support import (
    AMQP_URL,
    StartWorker,
    free_port,
    make_settings,
    monitor_process,
    ricochet_env,
    run_cli,
    wait_for,
)

TOKEN = "job-views-token-0123456789"


def _router() -> Router:
    router = Router()

    @router.handler("report")
    async def report(job: Job) -> dict[str, Any]:
        return {"rows": job.payload["rows"]}

    @router.handler("broken")
    async def broken(job: Job) -> None:
        raise ValueError(f"no template for {job.message_id}")

    return router


async def get(url: str, **headers: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as answer:
        text = await answer.text()
        is_json = answer.content_type == "application/json"
        return answer.status, json.loads(text) if is_json else text


async def state_of(base: str, message_id: str, queue: str) -> str | None:
    status, shown = await get(f"{base}/api/jobs/{message_id}?queue={queue}")
    return shown["state"] if status == 200 else None


async def test_the_monitor_answers_from_its_index_of_the_journal(
    start_worker: StartWorker, queue_name: str
) -> None:
    """Jobs that ran before the monitor started and after: /api/jobs/<id> answers each with its
    state, attempts and result (withheld without the token, given with it, a 401 for a wrong
    one; a failed job has nothing withheld), /api/jobs pages
    newest first with a cursor and filters, the pages show the same, and an unknown id is a 404;
    bad filters are a 400 that says what is wrong."""
    await start_worker(_router(), max_retries=0)
    async with Client(AMQP_URL, queue_name) as client:
        for i in range(3):
            await client.enqueue("report", {"rows": i}, message_id=f"{queue_name}-before-{i}")
        await client.enqueue("broken", {}, message_id=f"{queue_name}-broken")
        async with monitor_process(queue_name, TOKEN) as base:
            before = f"{queue_name}-before-2"
            await wait_for(
                lambda: _is(base, before, queue_name, "succeeded"), 20, "a job written before"
            )
            await client.enqueue("report", {"rows": 7}, message_id=f"{queue_name}-after")
            after = f"{queue_name}-after"
            await wait_for(lambda: _is(base, after, queue_name, "succeeded"), 20, "a job after")
            await wait_for(
                lambda: _is(base, f"{queue_name}-broken", queue_name, "failed"), 20, "the failure"
            )

            status, shown = await get(f"{base}/api/jobs/{after}")
            assert status == 200
            assert shown["complete"] is True
            assert (shown["queue"], shown["type"], shown["state"]) == (
                queue_name,
                "report",
                "succeeded",
            )
            assert [a["outcome"] for a in shown["attempts"]] == ["succeeded"]
            assert shown["result"] is None
            assert shown["result_withheld"] is True
            status, shown = await get(f"{base}/api/jobs/{after}", Authorization=f"Bearer {TOKEN}")
            assert shown["result"] == {"rows": 7}
            assert "result_withheld" not in shown
            status, wrong = await get(f"{base}/api/jobs/{after}", Authorization="Bearer nope")
            assert status == 401
            assert wrong["error"] == "wrong console token"

            status, failed = await get(f"{base}/api/jobs/{queue_name}-broken")
            assert failed["state"] == "failed"
            assert "result_withheld" not in failed
            assert f"no template for {queue_name}-broken" in failed["attempts"][-1]["reason"]

            status, missing = await get(f"{base}/api/jobs/{queue_name}-never")
            assert status == 404
            assert "no job" in missing["error"]

            query = f"queue={queue_name}&type=report&limit=2"
            status, first = await get(f"{base}/api/jobs?{query}")
            assert status == 200
            assert [r["message_id"] for r in first["jobs"]] == [after, before]
            status, second = await get(f"{base}/api/jobs?{query}&before={first['next']}")
            assert [r["message_id"] for r in second["jobs"]] == [
                f"{queue_name}-before-1",
                f"{queue_name}-before-0",
            ]
            assert second["next"] is None
            status, failures = await get(f"{base}/api/jobs?queue={queue_name}&state=failed")
            assert [r["message_id"] for r in failures["jobs"]] == [f"{queue_name}-broken"]
            for bad, why in [
                ("state=lost", "state must be one of"),
                ("limit=0", "limit must be"),
                ("limit=501", "limit must be"),
                ("before=nonsense", "is not a cursor"),
            ]:
                status, text = await get(f"{base}/api/jobs?{bad}")
                assert (status, why in text) == (400, True), (bad, text)

            status, html = await get(f"{base}/jobs?queue={queue_name}")
            assert status == 200
            assert f"/jobs/{after}?queue=" in html
            status, html = await get(f"{base}/jobs/{after}?queue={queue_name}")
            assert status == 200
            assert "shown with the console token" in html
            assert "&#34;rows&#34;: 7" not in html
            async with aiohttp.ClientSession() as session:
                form = {"token": TOKEN}
                async with session.post(f"{base}/jobs/{after}?queue={queue_name}", data=form) as r:
                    assert r.status == 200
                    assert "&#34;rows&#34;: 7" in await r.text()
                async with session.post(f"{base}/jobs/{after}", data={"token": "nope"}) as r:
                    assert r.status == 403


async def _is(base: str, message_id: str, queue: str, state: str) -> bool:
    return await state_of(base, message_id, queue) == state


async def test_ricochet_job_asks_the_monitor_when_told_where_it_is(
    start_worker: StartWorker, queue_name: str
) -> None:
    """With RICOCHET_MONITOR_URL, `ricochet job` prints what the monitor's index has (the same
    JSON as read back); a monitor that does not answer, or does not know the id, leaves it to
    read the journal back, and says so; an id the journal does not know either exits 1."""
    await start_worker(_router())
    message_id = f"{queue_name}-asked"
    async with Client(AMQP_URL, queue_name) as client:
        await client.enqueue("report", {"rows": 3}, message_id=message_id)
    async with monitor_process(queue_name) as base:
        await wait_for(lambda: _is(base, message_id, queue_name, "succeeded"), 20, "the job")
        env = ricochet_env(make_settings(queue_name), RICOCHET_MONITOR_URL=base)
        asked = await asyncio.to_thread(run_cli, ["job", message_id, "--json"], env)
        assert asked.returncode == 0, asked.stderr
        shown = json.loads(asked.stdout)
        assert shown["state"] == "succeeded"
        assert shown["result"] == {"rows": 3}
        assert "read the journal since" not in asked.stderr  # not read back
        unknown = await asyncio.to_thread(run_cli, ["job", f"{queue_name}-never"], env)
        assert unknown.returncode == 1
        assert f"the monitor at {base.removeprefix('http://')} knows no job" in unknown.stderr
        assert "no job" in unknown.stderr.splitlines()[-1]  # nor does the journal read back
    closed = f"http://127.0.0.1:{free_port()}/"
    env = ricochet_env(make_settings(queue_name), RICOCHET_MONITOR_URL=closed)
    read_back = await asyncio.to_thread(run_cli, ["job", message_id], env)
    assert read_back.returncode == 0, read_back.stderr
    assert "did not answer" in read_back.stderr
    assert "read the journal since" in read_back.stderr
    assert "state:       succeeded" in read_back.stdout
