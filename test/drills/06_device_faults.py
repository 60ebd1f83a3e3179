"""Drill 6 (§19.4): device-side faults.  A client crashing mid-batch and a
lost ACK; a generation-5 ACK arriving during a generation-6 snapshot;
recovery after lease expiry; recovery during GC and log truncation with an
old device (-> RESET_REQUIRED -> snapshot).  "Time passing" is simulated as
superuser by moving expiry/last-seen stamps back; nothing else is touched.
The dirty-marker race (shared_log mode) is drill 7, 07_dirty_marker_race.py."""
from drill_lib import *

set_paused(True)
# Fresh users per run, so the drill can be re-run on the same database.
U = 1_000_000 + int(time.time() * 10) % 1_000_000 * 2
conv = q1("SELECT im.create_conversation('group', %s)", ([U, U + 1],))


def send(n, tag):
    for i in range(n):
        q("SELECT im.send_message(%s, %s, %s, '{\"t\":1}')", (U + 1, conv, f"{U}-{tag}-{i}"))
    run_fanout_until_drained()


def sync(dev, gen, la):
    return q("SELECT status, sync_generation, batch_token, resume_from, batch_high_watermark, "
             "server_acked_sync_seq, jsonb_array_length(events) FROM im.sync_changes(%s, %s, %s, %s, 1000)",
             (U, dev, gen, la))[0]


def snapshot(dev):
    st, sid, gen, base, tok, pages, digest = q("SELECT * FROM im.begin_snapshot(%s, %s)", (U, dev))[0]
    for p in range(pages):
        q("SELECT * FROM im.fetch_snapshot(%s, %s, %s, %s)", (U, dev, tok, p))
    r = q("SELECT status, acked_sync_seq FROM im.ack_snapshot(%s, %s, %s, %s)", (U, dev, tok, digest))[0]
    return gen, base, r


def dev_row(dev):
    return q("SELECT state, sync_generation, acked_sync_seq FROM im.device WHERE user_id = %s AND device_id = %s",
             (U, dev))[0]


q("SELECT * FROM im.register_device(%s, 'phone')", (U,))
send(5, "a")
gen, base, r = snapshot("phone")
check(r[0] == "OK", f"new device installs its snapshot (S = {base})")

drill("crash_mid_batch_and_lost_ack",
      "client crashes after receiving a batch, before applying/ACKing; later an ACK reply is lost and the ACK repeated",
      "the same batch is served again from the server ACK; a repeated or older ACK never moves the cursor back")
send(4, "b")
st1 = sync("phone", gen, base)
st2 = sync("phone", gen, base)   # after the crash: same local position
check(st1[0] == "OK" and st2[0] == "OK" and st1[3] == st2[3] and st1[6] == st2[6] == 4,
      "the batch is served again from the same resume_from with the same events")
tok, hw = st2[2], st2[4]
a1 = q("SELECT status, acked_sync_seq FROM im.ack_sync(%s, 'phone', %s, %s)", (U, tok, hw))[0]
a2 = q("SELECT status, acked_sync_seq FROM im.ack_sync(%s, 'phone', %s, %s)", (U, tok, hw))[0]
a3 = q("SELECT status, acked_sync_seq FROM im.ack_sync(%s, 'phone', %s, %s)", (U, tok, hw - 2))[0]
check(a1 == ("OK", hw) and a2 == ("OK", hw) and a3 == ("OK", hw), f"repeated and older ACKs are OK and keep {hw}")
reconcile_zero()

drill("stale_generation_ack",
      "a generation-N batch ACK arrives while the device installs a generation-N+1 snapshot",
      "the old ACK is refused (STALE_GENERATION) and does not move the cursor past uninstalled events")
send(3, "c")
g, _, _ = dev_row("phone")[1], None, None
old = sync("phone", g, hw)
st, sid, g6, base6, tok6, pages, digest = q("SELECT * FROM im.begin_snapshot(%s, 'phone')", (U,))[0]
late = q("SELECT status, acked_sync_seq FROM im.ack_sync(%s, 'phone', %s, %s)", (U, old[2], old[4]))[0]
check(late[0] == "STALE_GENERATION" and dev_row("phone")[2] == hw,
      f"generation-{g} ACK during generation-{g6} snapshot: {late[0]}, cursor stays {hw}")
for p in range(pages):
    q("SELECT * FROM im.fetch_snapshot(%s, 'phone', %s, %s)", (U, tok6, p))
r = q("SELECT status, acked_sync_seq FROM im.ack_snapshot(%s, 'phone', %s, %s)", (U, tok6, digest))[0]
check(r == ("OK", base6), f"the snapshot installs with ACK = S = {base6}")
gen, ack = g6, base6
reconcile_zero()

drill("recovery_after_lease_expiry",
      "a device rolls back below its ACK (recovery session), then its lease expires before it finishes",
      "an expired recovery ends in RESET_REQUIRED and a snapshot, never in a partial page")
send(3, "d")
st = sync("phone", gen, ack - 2)
check(st[0] == "RECOVERY", f"rollback to {ack - 2} below ACK {ack} starts a recovery ({st[0]})")
q("UPDATE im.recovery_session SET expires_at = now() - interval '1 s' WHERE user_id = %s AND state = 'ACTIVE'", (U,))
st = sync("phone", st[1], ack - 2)
check(st[0] == "RESET_REQUIRED", f"after the lease expired: {st[0]}")
gen, ack, r = snapshot("phone")
check(r[0] == "OK", "the device recovers by snapshot")
q("UPDATE im.recovery_session SET state = 'EXPIRED' WHERE user_id = %s AND state = 'ACTIVE' "
  "AND expires_at < now()", (U,))   # an ended lease must not linger as ACTIVE (reconcile checks it)
reconcile_zero()

gc_ok = True
probe = connect(autocommit=False)
try:
    # Probe without side effects: collecting now would move the fence.
    probe.cursor().execute("SELECT * FROM im.gc_inbox()")
except psycopg2.Error as e:
    gc_ok = False
    gc_err = str(e).splitlines()[0]
probe.rollback()
probe.close()
if not gc_ok:
    skip("recovery_during_gc", f"im.gc_inbox() raises: {gc_err}")
    skip("log_truncation_old_device", f"im.gc_inbox() raises: {gc_err}")
else:
    drill("recovery_during_gc", "GC (retention 0) runs while a device replays a rollback in a recovery session",
          "the recovery lease holds the fence: every page of the session is complete")
    send(3, "e")
    ok = sync("phone", gen, ack)
    q("SELECT * FROM im.ack_sync(%s, 'phone', %s, %s)", (U, ok[2], ok[4]))
    ack = ok[4]
    st = sync("phone", gen, ack - 2)
    q("SET im_sync.inbox_retention = 0; SELECT * FROM im.gc_inbox()")
    st2 = sync("phone", st[1], ack - 2)
    check(st[0] == "RECOVERY" and st2[0] == "RECOVERY" and st2[6] == st[6],
          f"recovery batch still complete after GC ({st[6]} events before, {st2[6]} after)")
    a = q("SELECT status FROM im.ack_sync(%s, 'phone', %s, %s)", (U, st2[2], st2[4]))[0]
    check(a[0] == "OK", "the recovery completes")
    gen, ack = st2[1], st2[4]
    reconcile_zero()

    drill("log_truncation_old_device", "an old device silent past device_inactive_after; GC truncates the log past its ACK",
          "the old device gets RESET_REQUIRED and a snapshot, never a gap")
    q("SELECT * FROM im.register_device(%s, 'old')", (U,))
    og, ob, _ = snapshot("old")
    send(5, "f")
    ok = sync("phone", gen, ack)   # the active phone catches up, so only "old" lags behind the fence
    q("SELECT * FROM im.ack_sync(%s, 'phone', %s, %s)", (U, ok[2], ok[4]))
    q("UPDATE im.device SET last_seen_at = now() - interval '60 days' WHERE user_id = %s AND device_id = 'old'", (U,))
    q("SET im_sync.inbox_retention = 0; SELECT * FROM im.gc_inbox()")
    st = sync("old", og, ob)
    check(st[0] == "RESET_REQUIRED", f"old device after truncation: {st[0]}")
    _, _, r = snapshot("old")
    check(r[0] == "OK", "it rebuilds from a snapshot")
    reconcile_zero()

# dirty_marker_race: covered by drill 7 (07_dirty_marker_race.py).
finish("device_faults")
