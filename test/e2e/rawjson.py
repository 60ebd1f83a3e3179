"""Raw-JSON helpers for the data-path e2e tests: frames are written as text
(so numbers go out exactly as written) and replies are parsed with
Decimal numbers (so they come back exactly as the gateway printed them)."""
import asyncio
import itertools
import json
from decimal import Decimal

_ids = itertools.count(1_000_000)


def loads(text):
    return json.loads(text, parse_int=Decimal, parse_float=Decimal)


def same(a, b):
    """JSON equality: numbers as decimals, objects as dicts, types strict
    (true is not 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


async def raw_req(client, fields, raw=None, timeout=30):
    """Sends {"id":N, fields…[, raw]} where raw is text spliced in as the
    last members (e.g. '"body":{…}'); returns the reply with that id, parsed
    with Decimal numbers.  Hints are skipped."""
    rid = next(_ids)
    text = json.dumps(dict(fields, id=rid))
    if raw is not None:
        text = text[:-1] + "," + raw + "}"
    await client.ws.send(text)
    loop = asyncio.get_event_loop()
    deadline = loop.time() + timeout
    while True:
        left = deadline - loop.time()
        if left <= 0:
            raise TimeoutError("no reply to %d" % rid)
        f = loads(await asyncio.wait_for(client.ws.recv(), left))
        if f.get("type") == "hint":
            continue
        if f.get("code") == "RATE_LIMITED" and "id" not in f:
            # the frame was dropped by the session's rate limit: send it again
            await asyncio.sleep(int(f["retry_after_ms"]) / 1000)
            await client.ws.send(text)
            continue
        if f.get("id") == rid:
            return f
        if f.get("type") == "error" and "id" not in f:
            # a frame whose numbers the gateway cannot even read (a real past
            # double) is answered without its id; one request is outstanding
            # and a session answers in order, so this is its answer
            return f
