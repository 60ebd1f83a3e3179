#!/usr/bin/env python3
"""The extension owner switch contains a compromised owner role.

Run by test/suites/40-worker.sh against database im_test (after
worker_check.py; workers start paused, this script unpauses them and
pauses them again).  Each check prints one "ok"/"FAIL" line; exit status 1
if any failed.  What it proves:
  - im.set_extension_owner refuses (42501) a role that can log in, a NOLOGIN
    role with a member, and a role with CREATEROLE; it keeps itself and the
    schema im a superuser's, so the owner cannot rewrite it or add an
    overload a superuser's call would pick;
  - a session acting as the owner role (a superuser's SET ROLE) adds a
    plpgsql trigger on im.inbox that tries what only a superuser may (ALTER
    ROLE ... SUPERUSER for another login role, CREATE ROLE ... SUPERUSER,
    GRANT of the owner to a login role, SET ROLE to the bootstrap superuser,
    making the owner LOGIN); after the workers fanned a message out through
    it, every attempt failed, the trigger ran as the owner, and no role
    gained anything;
  - an API function the owner made SECURITY INVOKER refuses (42501) a
    superuser caller instead of running the owner's objects as superuser;
  - a member granted to the owner after the switch stops the workers: each
    refuses in a round after a message was sent (pg_stat_activity shows it),
    logs why once, and fans out nothing; after REVOKE they resume and
    deliver it.
Everything it creates is dropped at the end and the extension is handed
back to the superuser.
"""
import os
import sys

import psycopg2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from checklib import check, connect, failures, wait_for, Session  # noqa: E402

WORKER_TYPE = "im_sync fanout worker"
REFUSING = "im_sync fanout worker: refusing to run, the extension's owner is unfit"
BASE = 5_000_000          # user ids of this test (nothing else uses them)
OWNER, VICTIM, MEMBER, LOGIN = "im_wo_owner", "im_wo_victim", "im_wo_member", "im_wo_login"
MADE = "im_wo_made"       # what the trigger tries to create

session = Session()
q, q1, set_system = session.q, session.q1, session.set_system
LOG = os.path.join(os.environ.get("IM_TMP", "/nonexistent"), "server.log")


def error_of(sql, args=None):
    try:
        q(sql, args)
    except psycopg2.Error as e:
        return e.pgcode, e.pgerror
    return None


def log_text():
    with open(LOG, errors="replace") as f:
        return f.read()


def pending(conv):
    return q1("SELECT count(*) FROM im.outbox WHERE conversation_id = %s AND state = 'pending'", (conv,))


def role(name):
    return q1("SELECT row(rolsuper, rolcanlogin, rolcreaterole)::text FROM pg_roles WHERE rolname = %s", (name,))


conv_ids = []
superuser = q1("SELECT current_user")
try:
    n_workers = int(q1("SHOW im_sync.fanout_workers"))
    for r in (OWNER,):
        q(f"CREATE ROLE {r} NOLOGIN")
    for r in (VICTIM, MEMBER, LOGIN):
        q(f"CREATE ROLE {r} LOGIN")
    roles_before = q("SELECT rolname, rolsuper, rolcanlogin, rolcreaterole FROM pg_roles ORDER BY 1")
    grants_before = q("SELECT roleid, member FROM pg_auth_members ORDER BY 1, 2")

    # --- the switch refuses an owner someone else could act as
    err = error_of("SELECT im.set_extension_owner(%s)", (LOGIN,))
    check(err is not None and err[0] == "42501", "set_extension_owner refuses a LOGIN role: 42501", f"{err}")
    q(f"GRANT {OWNER} TO {MEMBER}")
    err = error_of("SELECT im.set_extension_owner(%s)", (OWNER,))
    check(err is not None and err[0] == "42501" and "has members" in err[1],
          "set_extension_owner refuses a NOLOGIN role with a member: 42501", f"{err}")
    q(f"REVOKE {OWNER} FROM {MEMBER}")
    q(f"ALTER ROLE {OWNER} CREATEROLE")
    err = error_of("SELECT im.set_extension_owner(%s)", (OWNER,))
    check(err is not None and err[0] == "42501", "set_extension_owner refuses a CREATEROLE role: 42501", f"{err}")
    q(f"ALTER ROLE {OWNER} NOCREATEROLE")
    check(q1("SELECT im.set_extension_owner(%s)", (OWNER,)) > 40, "set_extension_owner hands the extension to a fit role")
    check(q1("SELECT relowner::regrole::text FROM pg_class WHERE oid = 'im.inbox'::regclass") == OWNER,
          "the tables belong to the owner role")
    check(q1("""SELECT r.rolsuper FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner
                 WHERE p.oid = 'im.set_extension_owner(regrole)'::regprocedure"""),
          "set_extension_owner stays a superuser's (the owner cannot rewrite what a superuser runs)")
    check(q1("SELECT r.rolsuper FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner WHERE n.nspname = 'im'")
          and not q1("SELECT has_schema_privilege(%s, 'im', 'CREATE')", (OWNER,))
          and q1("SELECT has_schema_privilege(%s, 'im', 'USAGE')", (OWNER,)),
          "the schema im stays a superuser's; the owner has USAGE, no CREATE (no overloads, no rewritten functions)")

    # --- the owner's trigger: runs in the workers' fanout, as the owner
    q(f"CREATE SCHEMA im_wo_evil AUTHORIZATION {OWNER}")
    q(f"SET ROLE {OWNER}")
    q("CREATE TABLE im_wo_evil.outcome (attempt text, result text, as_user name, in_session name)")
    q(f"""CREATE FUNCTION im_wo_evil.grab() RETURNS trigger LANGUAGE plpgsql AS $$
         DECLARE
           attempt text;
           boot name := (SELECT rolname FROM pg_catalog.pg_roles WHERE oid = 10);
         BEGIN
           FOREACH attempt IN ARRAY ARRAY[
               'ALTER ROLE {VICTIM} SUPERUSER',
               'CREATE ROLE {MADE} SUPERUSER LOGIN',
               'GRANT {OWNER} TO {VICTIM}',
               'ALTER ROLE {OWNER} LOGIN',
               pg_catalog.format('SET ROLE %I', boot),
               'RESET ROLE']
           LOOP
             BEGIN
               EXECUTE attempt;
               INSERT INTO im_wo_evil.outcome VALUES (attempt, 'done', current_user, session_user);
             EXCEPTION WHEN OTHERS THEN
               INSERT INTO im_wo_evil.outcome VALUES (attempt, SQLSTATE, current_user, session_user);
             END;
           END LOOP;
           RETURN NEW;
         END $$""")
    q("CREATE TRIGGER im_wo_grab BEFORE INSERT ON im.inbox FOR EACH ROW EXECUTE FUNCTION im_wo_evil.grab()")
    q("RESET ROLE")
    members = [BASE + 1, BASE + 2]
    conv = q1("SELECT im.create_conversation('group', %s::bigint[], %s)", (members, members[0]))
    conv_ids.append(conv)
    q("SELECT * FROM im.send_message(%s, %s, 'wo-1', '{\"text\": \"through the trigger\"}')", (members[0], conv))
    set_system("im_sync.fanout_paused", "off")
    check(wait_for(lambda: pending(conv) == 0, 60), "the workers fan out through the owner's trigger")
    outcomes = q("SELECT attempt, result, as_user, in_session FROM im_wo_evil.outcome")
    check(len(outcomes) > 0, "the owner's trigger ran in the workers' fanout", f"{outcomes}")
    check(all(o[1] != "done" for o in outcomes), "every privileged attempt of the trigger failed",
          f"{[o for o in outcomes if o[1] == 'done']}")
    check(all(o[2] == OWNER for o in outcomes), "the trigger ran as the owner role, not as the superuser",
          f"{set(o[2] for o in outcomes)}")
    check(role(VICTIM) == "(f,t,f)", "the other login role did not become superuser", role(VICTIM))
    check(role(MADE) is None, "no superuser role was created", role(MADE))
    check(role(OWNER) == "(f,f,f)", "the owner role did not make itself LOGIN", role(OWNER))
    check(q("SELECT roleid, member FROM pg_auth_members ORDER BY 1, 2") == grants_before,
          "nobody was granted any role")
    check(q("SELECT rolname, rolsuper, rolcanlogin, rolcreaterole FROM pg_roles WHERE rolname <> %s ORDER BY 1",
            (MADE,)) == roles_before, "no role's attributes changed")
    q("DROP TRIGGER im_wo_grab ON im.inbox")

    # --- the owner turns an API function SECURITY INVOKER (it owns it): a
    # superuser calling it would run the owner's triggers and expressions
    # as superuser; the extension refuses to run for a superuser over a
    # non-superuser's tables
    q(f"SET ROLE {OWNER}")
    q("ALTER FUNCTION im.reconcile() SECURITY INVOKER")
    q("RESET ROLE")
    err = error_of("SELECT count(*) FROM im.reconcile()")
    check(err is not None and err[0] == "42501",
          "an API function the owner made SECURITY INVOKER refuses a superuser caller: 42501", f"{err}")
    q("ALTER FUNCTION im.reconcile() SECURITY DEFINER")

    # --- a member granted after the switch: the workers refuse, every round
    q(f"GRANT {OWNER} TO {MEMBER}")
    q("SELECT * FROM im.send_message(%s, %s, 'wo-2', '{\"text\": \"while the owner has a member\"}')",
      (members[0], conv))
    sent = q1("SELECT pg_catalog.statement_timestamp()")

    def all_refused_after_send():
        rows = q("SELECT query, state_change FROM pg_stat_activity WHERE backend_type = %s", (WORKER_TYPE,))
        return len(rows) == n_workers and all(r[0] == REFUSING and r[1] > sent for r in rows)

    check(wait_for(all_refused_after_send, 60),
          "every worker refuses a round after the send (pg_stat_activity)",
          f"{q('SELECT pid, query, state_change FROM pg_stat_activity WHERE backend_type = %s', (WORKER_TYPE,))}")
    check(pending(conv) == 1, "a refusing worker fans out nothing", f"{pending(conv)} pending")
    if os.path.exists(LOG):
        text = log_text()
        line = f'im_sync fanout worker refuses to run: the extension\'s owner role "{OWNER}" has members'
        check(text.count(line) == n_workers, "each worker logs its refusal once, saying why",
              f"{text.count(line)} lines")
    q(f"REVOKE {OWNER} FROM {MEMBER}")
    check(wait_for(lambda: pending(conv) == 0, 60), "after REVOKE the workers resume and deliver it")
    if os.path.exists(LOG):
        check(wait_for(lambda: log_text().count(f'im_sync fanout worker resumes: the extension\'s owner role "{OWNER}" is fit') == n_workers, 30),
              "each worker logs that it resumes")
    check(q1("SELECT count(*) FROM im.inbox i JOIN im.event e ON e.message_id = i.source_event_id "
             "WHERE e.client_msg_id IN ('wo-1', 'wo-2')") == 4, "both messages reached both members")
    check(q1("SELECT count(*) FROM im.reconcile()") == 0, "reconcile is clean")
finally:
    try:
        q("RESET ROLE")
        set_system("im_sync.fanout_paused", None)
        q("DROP TRIGGER IF EXISTS im_wo_grab ON im.inbox")
        q("SELECT im.set_extension_owner(%s)", (superuser,))
        q("DROP SCHEMA IF EXISTS im_wo_evil CASCADE")
        for sql in [
            "DELETE FROM im.inbox WHERE user_id >= %(lo)s AND user_id < %(hi)s",
            "DELETE FROM im.user_conversation WHERE conversation_id = ANY(%(c)s)",
            "DELETE FROM im.user_head WHERE user_id >= %(lo)s AND user_id < %(hi)s",
            "DELETE FROM im.outbox WHERE conversation_id = ANY(%(c)s)",
            "DELETE FROM im.membership_period WHERE conversation_id = ANY(%(c)s)",
            "DELETE FROM im.event WHERE conversation_id = ANY(%(c)s)",
            "DELETE FROM im.conversation WHERE conversation_id = ANY(%(c)s)",
        ]:
            q(sql, {"c": conv_ids, "lo": BASE, "hi": BASE + 1_000_000})
        for r in (MADE, VICTIM, MEMBER, LOGIN, OWNER):
            if role(r) is not None:
                q(f"DROP OWNED BY {r}")
                q(f"DROP ROLE {r}")
    except Exception as e:  # cleanup problems are failures too
        check(False, "cleanup", str(e))

print(f"owner checks: {len(failures)} failed")
sys.exit(1 if failures else 0)
