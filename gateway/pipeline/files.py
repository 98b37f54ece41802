"""Files and batches: kept upstream, owned here by the team whose key made them.

- **Upload** (`POST /v1/files`): the file goes to a deployment of the model it is for: the
  form's `model` field (the gateway's own, never sent on), else, for a batch file, the model its
  requests name (one model a file, as OpenAI's batches require; each request's `model` is
  rewritten to the deployment's). The key must be allowed that model.
- **Every later call on it** (retrieve, content, delete; a batch made from it, and that batch's
  retrieve and cancel) goes to that same deployment. An object of another team's, or one the
  gateway never saw, is a 404 alike.
- **Lists** are answered from the store: the caller's team's objects alone.
- **A batch is admitted against its budgets when it is created**: under a key's, team's or end
  user's budget, its input file is read and the most its requests may cost
  (gateway.metering.batch_estimate) reserved, as a request's would be; a hard budget it does not
  fit refuses it (429 `budget_exceeded`), as does one it cannot be priced under (403
  `price_unknown`). Once created, that estimate counts as spent in this process: the batch's
  own cost comes days later, and is read back with the other usage records when the period's
  spend is next loaded.
- **A batch is metered once its results are known**: the first retrieve that finds it
  `completed` reads its output file, sums its requests' usage, and writes a usage row at the
  model's batch prices (gateway.metering.call_prices) for each end user its requests are for:
  the key's own user, else the `user` each request of its input file names; its output and
  error files become the team's own.

Uploads, deletes, batch creations and cancels are in the request log (gateway.pipeline.calls'
rows), with no cost of their own, each naming its end user as any call does
(gateway.pipeline.calls.end_user).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

from gateway.context import Gateway
from gateway.errors import GatewayError, InvalidRequest, NotFound, PriceUnknown, UpstreamError
from gateway.forms import Form, Part
from gateway.metering.batch_estimate import estimate_batch
from gateway.metering.call_prices import Bill, batch_bill
from gateway.metering.keys import Principal
from gateway.metering.limits import Lease, scopes_of
from gateway.metering.tokens import vendor_of
from gateway.pipeline.calls import meter_call, serves
from gateway.routing.router import Deployment
from gateway.storage import objects
from gateway.storage.objects import BATCH, FILE, Owned
from gateway.upstream.seam import UpstreamBody, read_all

# The gateway's own form field naming the model a file is for: never sent upstream.
MODEL_FIELD = "model"


def _serving(gateway: Gateway, principal: Principal, model: str) -> tuple[str, Deployment]:
    alias = gateway.routes.alias(model, principal)
    for deployment in gateway.routes.plan(alias, {}):
        if serves(deployment, "files"):
            return alias.name, deployment
    raise InvalidRequest(
        f"The model `{alias.model}` has no deployment that keeps files (/v1/files).",
        param="model",
    )


def _batch_lines(data: bytes) -> list[dict[str, Any]]:
    lines = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            request = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise InvalidRequest(
                f"Line {number} of the batch file is not JSON.", param="file"
            ) from None
        body = request.get("body") if isinstance(request, dict) else None
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise InvalidRequest(
                f"Line {number} of the batch file has no `body.model`.", param="file"
            )
        lines.append(request)
    if not lines:
        raise InvalidRequest("The batch file holds no request.", param="file")
    return lines


async def upload(
    gateway: Gateway, principal: Principal, form: Form, user: str | None = None
) -> tuple[bytes, str]:
    """Upload a file to its model's deployment; its object, and the deployment's name."""
    upload = form.file("file")
    purpose = form.value("purpose")
    if upload is None:
        raise InvalidRequest("Missing required file: 'file'.", param="file")
    if not purpose:
        raise InvalidRequest("Missing required parameter: 'purpose'.", param="purpose")
    model = form.value(MODEL_FIELD)
    lines = _batch_lines(upload.data) if purpose == "batch" else None
    if model is None and lines is not None:
        models = {line["body"]["model"] for line in lines}
        if len(models) > 1:
            raise InvalidRequest(
                f"A batch file's requests must all name one model; this one names"
                f" {', '.join(sorted(models))}.",
                param="file",
            )
        model = models.pop()
    if model is None:
        raise InvalidRequest(
            "Name the model this file is for in a `model` form field: the gateway keeps it with"
            " one of that model's deployments.",
            param="model",
        )
    alias, deployment = _serving(gateway, principal, model)
    parts = [p for p in form.parts if p.name != MODEL_FIELD]
    if lines is not None:
        # The requests name the alias; the deployment runs them as its own model.
        for line in lines:
            if line["body"]["model"] != model:
                raise InvalidRequest(
                    "A batch file's requests must all name the `model` the file is for.",
                    param="file",
                )
            line["body"]["model"] = deployment.upstream_model
        data = b"\n".join(orjson.dumps(line) for line in lines) + b"\n"
        parts = [
            Part(p.name, data, p.filename, p.content_type) if p is upload else p for p in parts
        ]
    started = time.monotonic()
    raw = await _call(
        gateway,
        principal,
        deployment,
        "files.create",
        "/files",
        form=Form(parts),
        started=started,
        user=user,
    )
    answer = _object(raw)
    await objects.save(
        gateway.store,
        Owned(
            str(answer["id"]),
            FILE,
            principal.team_id,
            principal.key_id,
            alias,
            deployment.name,
            time.time(),
            answer,
        ),
    )
    return raw, deployment.name


def _object(raw: bytes) -> dict[str, Any]:
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("id"), str):
        raise UpstreamError("the upstream's answer has no object id")
    return answer


async def _call(
    gateway: Gateway,
    principal: Principal,
    deployment: Deployment,
    endpoint: str | None,
    path: str,
    *,
    method: str = "POST",
    json: dict[str, Any] | None = None,
    form: Form | None = None,
    started: float | None = None,
    stream: bool = False,
    user: str | None = None,
) -> Any:
    """One call to the deployment; the whole answer (or, `stream`, the open body). With an
    `endpoint`, a row of the request log too, completed or failed, for the end user `user`."""
    try:
        response: UpstreamBody = await deployment.provider.call(  # type: ignore[attr-defined]
            endpoint or "files", path, json=json, form=form, method=method
        )
        result: Any = response if stream else await read_all(response)
    except UpstreamError as error:
        if endpoint is not None:
            _log(gateway, principal, deployment, endpoint, started, error=error, user=user)
        raise
    if endpoint is not None:
        _log(gateway, principal, deployment, endpoint, started, user=user)
    return result


def _log(
    gateway: Gateway,
    principal: Principal,
    deployment: Deployment,
    endpoint: str,
    started: float | None,
    *,
    error: GatewayError | None = None,
    bill: Bill | None = None,
    alias: str | None = None,
    user: str | None = None,
) -> None:
    meter_call(
        gateway,
        principal,
        deployment,
        endpoint,
        alias=alias or deployment.alias,
        started=started,
        user=user,
        bill=bill,
        error=error,
    )


async def owned(
    gateway: Gateway, principal: Principal, kind: str, object_id: str
) -> tuple[Owned, Deployment]:
    """An object of the caller's team and the deployment that keeps it; 404 otherwise."""
    found = await objects.get(gateway.store, kind, object_id)
    if found is None or not principal.sees(found.team_id):
        raise NotFound(f"No such {kind}: '{object_id}'.", code=f"{kind}_not_found")
    deployment = gateway.routes.deployment(found.deployment)
    if deployment is None:
        raise NotFound(
            f"The {kind} '{object_id}' is kept by the deployment {found.deployment!r}, which the"
            " config no longer has.",
            code=f"{kind}_not_found",
        )
    return found, deployment


async def retrieve_file(gateway: Gateway, principal: Principal, file_id: str) -> bytes:
    found, deployment = await owned(gateway, principal, FILE, file_id)
    raw = await _call(gateway, principal, deployment, None, f"/files/{file_id}", method="GET")
    found.object = _object(raw)
    await objects.save(gateway.store, found)
    return raw  # type: ignore[no-any-return]


async def file_content(gateway: Gateway, principal: Principal, file_id: str) -> UpstreamBody:
    _, deployment = await owned(gateway, principal, FILE, file_id)
    body: UpstreamBody = await _call(
        gateway, principal, deployment, None, f"/files/{file_id}/content", method="GET", stream=True
    )
    return body


async def delete_file(
    gateway: Gateway, principal: Principal, file_id: str, user: str | None = None
) -> bytes:
    _, deployment = await owned(gateway, principal, FILE, file_id)
    raw = await _call(
        gateway,
        principal,
        deployment,
        "files.delete",
        f"/files/{file_id}",
        method="DELETE",
        started=time.monotonic(),
        user=user,
    )
    await objects.deleted(gateway.store, file_id)
    return raw  # type: ignore[no-any-return]


async def create_batch(
    gateway: Gateway, principal: Principal, body: dict[str, Any], user: str | None = None
) -> bytes:
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise InvalidRequest("Missing required parameter: 'input_file_id'.", param="input_file_id")
    for name in ("endpoint", "completion_window"):
        if not isinstance(body.get(name), str):
            raise InvalidRequest(f"Missing required parameter: '{name}'.", param=name)
    try:
        found, deployment = await owned(gateway, principal, FILE, file_id)
    except NotFound:
        raise NotFound(
            f"No such file: '{file_id}'.", param="input_file_id", code="file_not_found"
        ) from None
    lease = await _admit_batch(gateway, principal, deployment, file_id, user)
    try:
        raw = await _call(
            gateway,
            principal,
            deployment,
            "batches.create",
            "/batches",
            json=body,
            started=time.monotonic(),
            user=user,
        )
        answer = _object(raw)
    except BaseException:
        if lease is not None:
            lease.release()
        raise
    if lease is not None:
        lease.settle(lease.cost, None)  # spent at its estimate: see the module's doc
    await objects.save(
        gateway.store,
        Owned(
            str(answer["id"]),
            BATCH,
            found.team_id,
            principal.key_id,
            found.alias,
            deployment.name,
            time.time(),
            answer,
        ),
    )
    return raw  # type: ignore[no-any-return]


async def _admit_batch(
    gateway: Gateway, principal: Principal, deployment: Deployment, file_id: str, user: str | None
) -> Lease | None:
    """The batch's reservation against the budgets of its key, team and end user, of the most
    its input file's requests may cost; None where none of them has a budget (the file is not
    read)."""
    scopes = [
        scope
        for scope in scopes_of(
            principal.key_limits,
            principal.team_limits,
            principal.key_id,
            principal.team_id,
            principal.user or user,
        )
        if scope[2].budget is not None
    ]
    if not scopes:
        return None
    content = await _call(
        gateway, principal, deployment, None, f"/files/{file_id}/content", method="GET"
    )
    model, price = deployment.upstream_model, deployment.price
    batch = estimate_batch(
        content,
        vendor_of(deployment.provider_name, model),
        model,
        price.max_output_tokens if price is not None else None,
    )
    prices = gateway.routes.call_prices(deployment)
    cost = batch_bill(prices, batch.prompt, batch.completion, batch.requests).cost
    for kind, ident, limits in scopes:
        if limits.budget is None or limits.budget.mode != "hard":
            continue
        if cost is None:
            raise PriceUnknown(
                f"The {kind} {ident!r} has a hard budget, and the deployment"
                f" {deployment.name!r} (model {model!r}) this batch runs on has no known price,"
                " so its cost could not be counted against it. Price the model in the price"
                " file (`prices:`), or set `price: free` on the deployment."
            )
        if batch.unbounded:
            raise PriceUnknown(
                f"The {kind} {ident!r} has a hard budget, and {batch.unbounded} of this"
                " batch's requests set no output bound while the output limit of the model"
                f" {model!r} is not known, so what they may cost could not be counted against"
                " it. Set `max_tokens` on each request, or `max_output_tokens` in the model's"
                " price."
            )
    return await gateway.limiter.admit(scopes, 0, cost or 0.0)


async def retrieve_batch(gateway: Gateway, principal: Principal, batch_id: str) -> bytes:
    found, deployment = await owned(gateway, principal, BATCH, batch_id)
    raw: bytes = await _call(
        gateway, principal, deployment, None, f"/batches/{batch_id}", method="GET"
    )
    found.object = _object(raw)
    await objects.save(gateway.store, found)
    if found.object.get("status") == "completed" and found.metered_at is None:
        await _results(gateway, principal, found, deployment)
    return raw


async def cancel_batch(
    gateway: Gateway, principal: Principal, batch_id: str, user: str | None = None
) -> bytes:
    found, deployment = await owned(gateway, principal, BATCH, batch_id)
    raw: bytes = await _call(
        gateway,
        principal,
        deployment,
        "batches.cancel",
        f"/batches/{batch_id}/cancel",
        started=time.monotonic(),
        user=user,
    )
    found.object = _object(raw)
    await objects.save(gateway.store, found)
    return raw


async def _results(
    gateway: Gateway, principal: Principal, batch: Owned, deployment: Deployment
) -> None:
    """A completed batch: its output and error files become its team's, and its requests'
    usage is metered once, at the model's batch prices, a row for each end user."""
    for name in ("output_file_id", "error_file_id"):
        file_id = batch.object.get(name)
        if isinstance(file_id, str) and file_id:
            await objects.save(
                gateway.store,
                Owned(
                    file_id,
                    FILE,
                    batch.team_id,
                    batch.key_id,
                    batch.alias,
                    deployment.name,
                    time.time(),
                    {"id": file_id, "object": "file", "purpose": "batch_output"},
                ),
            )
    if not await objects.metered(gateway.store, batch.id):
        return  # another request metered it first
    key = await gateway.keys.key(batch.key_id) if batch.key_id is not None else None
    own = key.user if key is not None else None  # first, as for any call (calls.end_user)
    owner = Principal("key", team_id=batch.team_id, key_id=batch.key_id)
    users = await _request_users(gateway, principal, batch, deployment) if own is None else {}
    # (prompt, completion, requests) by end user, in the order they come.
    counts: dict[str | None, list[int]] = {}
    output = batch.object.get("output_file_id")
    if isinstance(output, str) and output:
        content = await _call(
            gateway, principal, deployment, None, f"/files/{output}/content", method="GET"
        )
        for line in content.splitlines():
            try:
                result = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(result, dict):
                continue
            body = (result.get("response") or {}).get("body") or {}
            usage = body.get("usage") if isinstance(body, dict) else None
            if not isinstance(usage, dict):
                continue
            request = result.get("custom_id")
            user = own or (users.get(request) if isinstance(request, str) else None)
            tally = counts.setdefault(user, [0, 0, 0])
            tally[0] += _int(usage.get("prompt_tokens")) or _int(usage.get("input_tokens"))
            tally[1] += _int(usage.get("completion_tokens")) or _int(usage.get("output_tokens"))
            tally[2] += 1
    prices = gateway.routes.call_prices(deployment)
    for user, (prompt, completion, requests) in (counts or {own: [0, 0, 0]}).items():
        bill = batch_bill(prices, prompt, completion, requests)
        bill.units["batch"] = batch.id
        _log(gateway, owner, deployment, "batches", None, bill=bill, alias=batch.alias, user=user)


async def _request_users(
    gateway: Gateway, principal: Principal, batch: Owned, deployment: Deployment
) -> dict[str, str]:
    """The end user each request of a batch's input file names (its body's `user`), by its
    `custom_id`; none where the file is gone or names none."""
    source = batch.object.get("input_file_id")
    if not isinstance(source, str) or not source:
        return {}
    try:
        content = await _call(
            gateway, principal, deployment, None, f"/files/{source}/content", method="GET"
        )
    except UpstreamError:
        return {}  # deleted since: its requests are billed to no end user
    users: dict[str, str] = {}
    for line in content.splitlines():
        try:
            request = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(request, dict) or not isinstance(request.get("custom_id"), str):
            continue
        body = request.get("body")
        user = body.get("user") if isinstance(body, dict) else None
        if isinstance(user, str) and user:
            users[request["custom_id"]] = user
    return users


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def listing(items: list[Owned], more: bool) -> dict[str, Any]:
    data = [item.object for item in items]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


def json_answer(raw: bytes, deployment: str | None = None) -> web.Response:
    headers = {"X-Gateway-Deployment": deployment} if deployment else {}
    return web.Response(body=raw, content_type="application/json", headers=headers)
