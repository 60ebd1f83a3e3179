#!/usr/bin/env python3
"""e2e_dead_letter.py — the dead-letter alert seen through a real Prometheus.

test/suites/35-alerts.sh starts the cluster (fanout worker on database
$IM_ALERTS_DB), a gateway, and Prometheus scraping the gateway every second
with a copy of the shipped rules whose for: durations are shortened.  This
script makes a dead letter the poison drill's way (test/drills/
04_fanout_faults.py: a trigger on im.inbox that raises for one item,
im_sync.fanout_max_attempts = 2, the fanout worker failing it twice), polls
Prometheus's /api/v1/alerts until ImSyncFanoutDeadLetters fires, repairs
(drops the trigger, im.repair_fanout(retry_dead => true)) and polls until the
alert is gone.  Every wait polls against a deadline.  Printing, checks,
queries and waits are the drills' own (test/drills/drill_lib.py), on
database $IM_ALERTS_DB.
"""
import functools
import json
import os
import sys
import urllib.parse
import urllib.request

# the drills' helpers: say, check (failures), connecting and querying, wait_for
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "drills"))
import drill_lib  # noqa: E402
from drill_lib import say, check, failures  # noqa: E402

PROM = os.environ["IM_PROM_URL"].rstrip("/")
DB = os.environ.get("IM_ALERTS_DB", "im_alerts")
ALERT = "ImSyncFanoutDeadLetters"
# generous: the machine is shared; each wait returns as soon as its condition holds
DEADLINE = float(os.environ.get("IM_ALERTS_DEADLINE", "60"))
q = functools.partial(drill_lib.q, db=DB)
q1 = functools.partial(drill_lib.q1, db=DB)
wait_for = functools.partial(drill_lib.wait_for, timeout=DEADLINE)


def api(path, **params):
    url = f"{PROM}{path}" + (("?" + urllib.parse.urlencode(params)) if params else "")
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{url}: {body}")
    return body["data"]


def alerts(name):
    return [a for a in api("/api/v1/alerts")["alerts"] if a["labels"].get("alertname") == name]


def scraped_dead_letters():
    """im_fanout_dead_letters as Prometheus last scraped it through the gateway, or None."""
    r = api("/api/v1/query", query='im_fanout_dead_letters{job="im_gateway"}')["result"]
    return float(r[0]["value"][1]) if r else None


def firing():
    return [a for a in alerts(ALERT) if a["state"] == "firing"]


say("--- the dead-letter alert through Prometheus")
# Prometheus scrapes the gateway, and the gateway appends im.metrics() of the database
if not wait_for("Prometheus has scraped im_fanout_dead_letters = 0 through the gateway",
                lambda: scraped_dead_letters() == 0):
    sys.exit(1)
check(alerts(ALERT) == [], f"{ALERT} is neither pending nor firing before the fault")

# the fault: a poison conversation, whose every inbox row raises
conv = q1("SELECT im.create_conversation('group', '{35001,35002}')")
wait_for("the conversation's own events are fanned out",
         lambda: q1("SELECT count(*) FROM im.outbox WHERE conversation_id = %s AND state <> 'done'", (conv,)) == 0)
q(f"""CREATE FUNCTION public.alerts_poison() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN IF NEW.conversation_id = {int(conv)} THEN RAISE EXCEPTION 'alerts test: poison item'; END IF;
      RETURN NEW; END $$""")
q("CREATE TRIGGER alerts_poison BEFORE INSERT ON im.inbox FOR EACH ROW EXECUTE FUNCTION public.alerts_poison()")
q("ALTER SYSTEM SET im_sync.fanout_max_attempts = 2")
q("SELECT pg_catalog.pg_reload_conf()")
wait_for("the session sees fanout_max_attempts = 2",
         lambda: q1("SELECT current_setting('im_sync.fanout_max_attempts')") == "2")
poison = q1("SELECT message_id FROM im.send_message(35001, %s, 'alerts-poison', '{\"t\":\"x\"}')", (conv,))


def dead_yet():
    # the drill's way past the retry backoff: a failed item is made due again
    q("UPDATE im.outbox SET next_attempt_at = now() WHERE source_event_id = %s AND state = 'pending' "
      "AND attempts > 0 AND next_attempt_at > now()", (poison,))
    return q1("SELECT state FROM im.outbox WHERE source_event_id = %s", (poison,)) == "dead"


if not wait_for("the fanout worker made the poison item a dead letter", dead_yet):
    say(f"    outbox row: {q('SELECT state, attempts, next_attempt_at FROM im.outbox WHERE source_event_id = %s', (poison,))}")
    sys.exit(1)
check(q1("SELECT value FROM im.metrics() WHERE name = 'im_fanout_dead_letters'") == 1, "im.metrics() counts one dead letter")

got = wait_for(f"{ALERT} fires in Prometheus's /api/v1/alerts", firing)
if got:
    a = got[0]
    check(len(got) == 1, f"one {ALERT} alert for the one database ({len(got)})")
    check(a["labels"].get("severity") == "ticket" and a["labels"].get("job") == "im_gateway"
          and "instance" not in a["labels"], f"its labels: severity=ticket, job=im_gateway, no instance ({a['labels']})")
    check(float(a["value"]) == 1, f"its value is the one dead letter ({a['value']})")
    check(a["annotations"].get("runbook") == "extension/doc/runbook.md#a-user-says-a-message-is-missing",
          f"its runbook annotation ({a['annotations'].get('runbook')})")
    check(a["annotations"].get("summary") == "im_sync: 1 fanout dead letter(s)",
          f"its summary ({a['annotations'].get('summary')})")
check(not [a for a in alerts("ImSyncFanoutDeadLettersMany") if a["state"] == "firing"],
      "ImSyncFanoutDeadLettersMany does not fire for one dead letter")

# the repair
q("DROP TRIGGER alerts_poison ON im.inbox")
q("DROP FUNCTION public.alerts_poison()")
q("ALTER SYSTEM RESET im_sync.fanout_max_attempts")
q("SELECT pg_catalog.pg_reload_conf()")
acts = q("SELECT action FROM im.repair_fanout(retry_dead => true)")
check(acts == [("requeued",)], f"repair_fanout requeued the dead letter ({acts})")
wait_for("the fanout worker delivered the repaired item to both members",
         lambda: q1("SELECT count(*) FROM im.inbox WHERE source_event_id = %s", (poison,)) == 2)
wait_for("Prometheus has scraped im_fanout_dead_letters = 0 again", lambda: scraped_dead_letters() == 0)
wait_for(f"{ALERT} is gone from /api/v1/alerts (resolved)", lambda: not alerts(ALERT))

say(f"--- {'FAILED: ' + '; '.join(failures) if failures else 'ok'}")
sys.exit(1 if failures else 0)
