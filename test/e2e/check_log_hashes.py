#!/usr/bin/env python3
"""Log privacy (gateway side): the gateway's log names users and
devices only by keyed hashes (contract §12: HMAC-SHA256 cut to 16 hex
digits, user=h:… device=h:…, or "user":"h:…" in a --log-format json log,
whose every line must then be one JSON object).

Usage: check_log_hashes.py LOG [KEYFILE]
Checks that no user=/device= field holds a plain id, that one session's
lines carry the same hashes (stable within the process), and, given the
key file, that every hash is the HMAC of a device registered in the
database (user "u:<id>", device "d:<id>:<device>")."""
import hashlib
import hmac
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import sql  # noqa: E402

FIELD = re.compile(r"\b(user|device)=(\S+)")
SID = re.compile(r"\bsid=(\d+)")
HASH = re.compile(r"^h:[0-9a-f]{16}$")


def main(log, keyfile=None):
    bad, per_sid, seen = [], {}, {"user": set(), "device": set()}
    welcomes = 0
    lines = open(log, encoding="utf-8", errors="replace").read().splitlines()
    as_json = bool(lines) and lines[0].startswith("{")
    for line in lines:
        if as_json:
            try:
                rec = json.loads(line)
            except ValueError:
                bad.append("not JSON: " + line.strip())
                continue
            if not isinstance(rec, dict) or "ts" not in rec:
                bad.append("not a log record: " + line.strip())
                continue
            # no member may carry a token or a body, whatever its name
            for k in ("token", "body", "text"):
                if k in rec:
                    bad.append("%s in a log line: %s" % (k, line.strip()))
            fields = [(k, rec[k] if rec[k] is not None else "-") for k in ("user", "device") if k in rec]
            fields = [(k, v if isinstance(v, str) else repr(v)) for k, v in fields]
            if rec.get("event") == "welcome":
                welcomes += 1
            sid = re.match(r"(\d+)", str(rec["sid"])) if "sid" in rec else None
        else:
            fields = FIELD.findall(line)
            if "event=welcome" in line:
                welcomes += 1
            sid = SID.search(line)
        for k, v in fields:
            if v != "-" and not HASH.match(v):
                bad.append(line.strip())
                continue
            if v == "-":
                continue
            seen[k].add(v)
            if sid:
                prev = per_sid.setdefault((sid.group(1), k), v)
                if prev != v:
                    bad.append("sid %s %s hash changed: %s -> %s" % (sid.group(1), k, prev, v))
    assert not bad, "plain or unstable ids in the log:\n" + "\n".join(bad[:10])
    assert welcomes > 0 and seen["user"], "no welcome lines with user hashes in %s" % log
    if keyfile:
        key = open(keyfile, "rb").read().rstrip(b"\n").rstrip(b"\r")
        users, devices = set(), set()
        for u, d in sql("SELECT user_id, device_id FROM im.device"):
            users.add("h:" + hmac.new(key, b"u:%d" % u, hashlib.sha256).hexdigest()[:16])
            devices.add("h:" + hmac.new(key, ("d:%d:%s" % (u, d)).encode(), hashlib.sha256).hexdigest()[:16])
        assert seen["user"] <= users, "user hashes not keyed with --log-key: %r" % list(seen["user"] - users)[:3]
        assert seen["device"] <= devices, "device hashes not keyed: %r" % list(seen["device"] - devices)[:3]
    print("log hashes ok: %s (%d welcomes, %d users, %d devices%s)" % (
        os.path.basename(log), welcomes, len(seen["user"]), len(seen["device"]), ", keyed" if keyfile else ""))


if __name__ == "__main__":
    try:
        main(*sys.argv[1:])
    except AssertionError as e:
        print("FAIL log hashes: %s" % e)
        sys.exit(1)
