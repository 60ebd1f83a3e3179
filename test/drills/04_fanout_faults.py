"""Drill 4 (§19.4, §10.2): fanout faults driven with im.run_fanout (workers
paused): the same outbox item delivered twice; fanout paused while a member
leaves; a re-join while old items are queued; a poison item becoming a dead
letter while the conversation moves on, then repaired."""
from drill_lib import *

set_paused(True)


def state(conv):
    return q("SELECT user_id, last_msg_seq, unread_count FROM im.user_conversation "
             "WHERE conversation_id = %s ORDER BY 1", (conv,))


# -- the same outbox item delivered twice
drill("duplicate_delivery", "an already processed outbox item is set back to pending and fanned out again",
      "user events and unread counts change exactly once (idempotency key user, source_event_id, period)")
conv = q1("SELECT im.create_conversation('group', '{401,402,403}')")
mid = q1("SELECT message_id FROM im.send_message(401, %s, 'dup-1', '{\"t\":1}')", (conv,))
run_fanout_until_drained()
before = (q("SELECT user_id, sync_seq FROM im.inbox WHERE user_id IN (401,402,403) ORDER BY 1, 2"), state(conv))
q("UPDATE im.outbox SET state = 'pending', attempts = 0 WHERE source_event_id = %s", (mid,))
run_fanout_until_drained()
after = (q("SELECT user_id, sync_seq FROM im.inbox WHERE user_id IN (401,402,403) ORDER BY 1, 2"), state(conv))
check(before == after, "second delivery changed no log, head or unread count")
reconcile_zero()

# -- fanout paused, a member leaves, fanout resumes
drill("late_fanout_after_leave", "fanout paused; messages sent; a member leaves; fanout resumes",
      "recipients come from the periods covering each msg_seq, not from the current member list")
conv = q1("SELECT im.create_conversation('group', '{411,412,413}')")
m1 = q1("SELECT message_id FROM im.send_message(411, %s, 'late-1', '{\"t\":1}')", (conv,))
q("SELECT * FROM im.leave_conversation(%s, 413)", (conv,))
m2 = q1("SELECT message_id FROM im.send_message(411, %s, 'late-2', '{\"t\":2}')", (conv,))
run_fanout_until_drained()
check(q1("SELECT count(*) FROM im.inbox WHERE user_id = 413 AND source_event_id = %s", (m1,)) == 1,
      "the leaver still gets the message from inside its period")
check(q1("SELECT count(*) FROM im.inbox WHERE user_id = 413 AND source_event_id = %s", (m2,)) == 0,
      "the leaver does not get the message after its leave")
check(q1("SELECT count(*) FROM im.inbox i JOIN im.event e ON e.message_id = i.source_event_id "
         "WHERE i.user_id = 413 AND e.kind = 'leave' AND e.conversation_id = %s", (conv,)) == 1,
      "the leaver gets its own leave event")
reconcile_zero()

# -- re-join while old items are queued
drill("rejoin_with_queue", "fanout paused; member leaves, a message is sent, member re-joins, another message; then fanout",
      "old and new periods keep separate idempotency records; nothing from the gap is delivered")
conv = q1("SELECT im.create_conversation('group', '{421,422}')")
a = q1("SELECT message_id FROM im.send_message(421, %s, 'rj-a', '{\"t\":1}')", (conv,))
q("SELECT * FROM im.leave_conversation(%s, 422)", (conv,))
gap = q1("SELECT message_id FROM im.send_message(421, %s, 'rj-gap', '{\"t\":2}')", (conv,))
q("SELECT * FROM im.join_conversation(%s, 422)", (conv,))
b = q1("SELECT message_id FROM im.send_message(421, %s, 'rj-b', '{\"t\":3}')", (conv,))
run_fanout_until_drained()
got = dict(q("SELECT source_event_id, delivery_scope FROM im.inbox WHERE user_id = 422 AND source_event_id = ANY(%s)",
             ([a, gap, b],)))
check(gap not in got, "the message sent in the gap is not delivered")
check(a in got and b in got and got[a] != got[b], "before and after the gap arrive under different periods")
q("UPDATE im.outbox SET state = 'pending' WHERE source_event_id = ANY(%s)", ([a, gap, b],))
run_fanout_until_drained()
check(q1("SELECT count(*) FROM im.inbox WHERE user_id = 422 AND source_event_id = ANY(%s)", ([a, gap, b],)) == 2,
      "redelivering the old items adds nothing")
reconcile_zero()

# -- poison item -> dead letter while the conversation moves on
drill("poison_item", "a superuser trigger on im.inbox makes one item fail every time (fanout_max_attempts = 2)",
      "the item becomes a dead letter, later items of the conversation are delivered, reconcile reports it; "
      "after the cause is removed repair_fanout(retry_dead) delivers it once")
conv = q1("SELECT im.create_conversation('group', '{431,432}')")
poison = q1("SELECT message_id FROM im.send_message(431, %s, 'poison', '{\"t\":\"x\"}')", (conv,))
later = q1("SELECT message_id FROM im.send_message(431, %s, 'after-poison', '{\"t\":\"y\"}')", (conv,))
q(f"""CREATE FUNCTION public.drill_poison() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN IF NEW.source_event_id = {poison} THEN RAISE EXCEPTION 'drill: poison item'; END IF;
      RETURN NEW; END $$""")
q("CREATE TRIGGER drill_poison BEFORE INSERT ON im.inbox FOR EACH ROW EXECUTE FUNCTION public.drill_poison()")
q("ALTER SYSTEM SET im_sync.fanout_max_attempts = 2")
q("SELECT pg_catalog.pg_reload_conf()")
time.sleep(0.3)
for _ in range(6):
    q("UPDATE im.outbox SET next_attempt_at = now() WHERE state = 'pending'")
    q("SELECT im.run_fanout()")
check(q1("SELECT state FROM im.outbox WHERE source_event_id = %s", (poison,)) == "dead", "the poison item is a dead letter")
check(q1("SELECT count(*) FROM im.inbox WHERE source_event_id = %s", (later,)) == 2,
      "the conversation moved on: the later message reached both members")
rows = q("SELECT check_name FROM im.reconcile()")
check(("dead_letter",) in rows, "reconcile reports the dead letter")
check(q1("SELECT value FROM im.metrics() WHERE name = 'im_fanout_dead_letters'") == 1, "metrics count it")
q("DROP TRIGGER drill_poison ON im.inbox")
q("DROP FUNCTION public.drill_poison()")
q("ALTER SYSTEM RESET im_sync.fanout_max_attempts")
q("SELECT pg_catalog.pg_reload_conf()")
acts = q("SELECT action FROM im.repair_fanout(retry_dead => true)")
check(acts == [("requeued",)], f"repair_fanout requeued the dead letter ({acts})")
run_fanout_until_drained()
check(q1("SELECT count(*) FROM im.inbox WHERE source_event_id = %s", (poison,)) == 2,
      "after repair the item reached both members once")
reconcile_zero()
finish("fanout_faults")
