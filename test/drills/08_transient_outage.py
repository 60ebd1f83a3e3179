"""Drill 8 (contract §4): a long transient outage while the
real fanout workers run.  Two users' head rows stay locked by a stuck
session, and a trigger makes every inbox write of a third conversation fail
with SQLSTATE 53100 (disk full), both for far longer than
fanout_max_attempts x backoff allowed before the fix; messages keep being
sent to the affected and to healthy conversations meanwhile.

Fails on the code before the fix: a worker waited on the locked head for
ever (no lock_timeout), holding back every conversation of its batch, and
the disk-full item was charged as an attempt and became a dead letter."""
from drill_lib import *

OUTAGE_S = 30          # 2 attempts x 10 s backoff made a dead letter before the fix
HEALTHY_WAIT_S = 20    # bound for a healthy message to arrive, still inside the outage
DRAIN_S = 150          # a transient backoff is capped at 1 min

set_paused(True)
q("ALTER SYSTEM SET im_sync.fanout_max_attempts = 2")
q("SELECT pg_catalog.pg_reload_conf()")

drill("transient_outage",
      f"for {OUTAGE_S}+ s the heads of users 801 and 802 are held FOR UPDATE by an idle transaction, and a "
      "trigger fails every inbox write of one conversation with 53100; sends continue everywhere",
      "healthy conversations keep being delivered during the outage; transient failures are not attempts; "
      "after it every message is delivered exactly once, no dead letter, reconcile clean")


def group(members):
    return q1("SELECT im.create_conversation('group', %s)", (members,))


x1 = group([801, 811])
x2 = group([802, 812])
y = group([821, 822])
affected = [(x1, 811), (x2, 812), (y, 822)]
healthy = [(group([831 + i, 851 + i]), 851 + i) for i in range(6)]
q("CREATE TABLE public.drill_disk_full (conversation_id bigint PRIMARY KEY)")
q("""CREATE FUNCTION public.drill_disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF EXISTS (SELECT 1 FROM public.drill_disk_full d WHERE d.conversation_id = NEW.conversation_id) THEN
          RAISE EXCEPTION USING ERRCODE = '53100',
            MESSAGE = 'could not extend file: No space left on device (drill)';
        END IF;
        RETURN NEW;
      END $$""")
q("CREATE TRIGGER drill_disk_full BEFORE INSERT ON im.inbox FOR EACH ROW EXECUTE FUNCTION public.drill_disk_full()")

sent = []            # message ids, every one must reach both members once
healthy_sent = []
seq = [0]


def send(conv, sender):
    seq[0] += 1
    mid = q1("SELECT message_id FROM im.send_message(%s, %s, %s, %s)",
             (sender, conv, f"outage-{seq[0]}", '{"n": %d}' % seq[0]))
    sent.append(mid)
    return mid


def undelivered(mids):
    rows = q("SELECT m, (SELECT count(*) FROM im.inbox i WHERE i.source_event_id = m) "
             "FROM unnest(%s::bigint[]) m", (mids,))
    return [m for m, n in rows if n != 2]


lockers = []
try:
    for uid in (801, 802):
        c = connect(autocommit=False)
        c.cursor().execute("SELECT 1 FROM im.user_head WHERE user_id = %s FOR UPDATE", (uid,))
        lockers.append(c)
    q("INSERT INTO public.drill_disk_full VALUES (%s)", (y,))
    # A backlog in every conversation before the workers resume, so the
    # first batches mix affected and healthy conversations.
    for conv, sender in affected:
        send(conv, sender)
    for conv, sender in healthy:
        healthy_sent.append(send(conv, sender))
    set_paused(False)
    t0 = time.time()
    i = 0
    while time.time() - t0 < OUTAGE_S:
        for conv, sender in affected:
            send(conv, sender)
        conv, sender = healthy[i % len(healthy)]
        healthy_sent.append(send(conv, sender))
        i += 1
        time.sleep(0.5)
    # Still inside the outage (locks held, disk "full").
    deadline = time.time() + HEALTHY_WAIT_S
    while time.time() < deadline and undelivered(healthy_sent):
        time.sleep(0.2)
    late = undelivered(healthy_sent)
    check(not late, f"during the outage all {len(healthy_sent)} messages to healthy conversations were "
          f"delivered (undelivered: {len(late)})")
    stuck = q1("SELECT count(*) FROM im.outbox WHERE state = 'pending' AND conversation_id = ANY(%s)",
               ([x1, x2, y],))
    check(stuck > 0, f"the outage is real: {stuck} items of the affected conversations are still pending")
    check(q1("SELECT count(*) FROM im.outbox WHERE state = 'dead'") == 0, "no dead letter during the outage")
    check(q1("SELECT coalesce(max(attempts), 0) FROM im.outbox WHERE conversation_id = ANY(%s)", ([x1, x2, y],)) == 0,
          "transient failures were not charged as attempts")
    metrics = dict(q("SELECT name, value FROM im.metrics() WHERE name IN "
                     "('im_outbox_backing_off', 'im_fanout_transient_failures_total')"))
    check(metrics.get("im_outbox_backing_off", 0) > 0 and metrics.get("im_fanout_transient_failures_total", 0) > 0,
          f"im.metrics shows the backing-off items and the transient failures ({metrics})")
finally:
    for c in lockers:
        c.rollback()
        c.close()
    q("DELETE FROM public.drill_disk_full")

check(wait_drained(timeout=DRAIN_S), f"after the outage the outbox drains (within {DRAIN_S} s)")
check(q1("SELECT count(*) FROM im.outbox WHERE state = 'dead'") == 0, "no dead letter")
missing = undelivered(sent)
check(not missing, f"all {len(sent)} messages reached both members exactly once (wrong count: {missing[:10]})")
check(q1("SELECT count(*) FROM im.user_head h WHERE h.user_id BETWEEN 801 AND 856 AND h.high_watermark <> "
         "(SELECT count(*) FROM im.inbox i WHERE i.user_id = h.user_id)") == 0,
      "every affected and healthy user's log is gap-free")
set_paused(True)
q("DROP TRIGGER drill_disk_full ON im.inbox")
q("DROP FUNCTION public.drill_disk_full()")
q("DROP TABLE public.drill_disk_full")
q("ALTER SYSTEM RESET im_sync.fanout_max_attempts")
q("SELECT pg_catalog.pg_reload_conf()")
reconcile_zero()
finish("transient_outage")
