#!/usr/bin/env python3
"""Roles, mutes and removals through the gateway (contract §17): the frames
`set_role` -> set_role_result, `mute_member` -> mute_member_result and
`remove_member` -> remove_member_result act as the session's user; a muted
member's send is FORBIDDEN with "reason": "muted" (IS403) and its session
goes on (reads still work); a member's mute attempt is FORBIDDEN without a
reason (42501); an unmute lets the member send again; the role, mute and
removal positions reach the members' devices through sync."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import run_tests, Client, new_user_ids, register, sql, expect, wait_events  # noqa: E402


async def test_muted_member_forbidden():
    owner, admin, member = new_user_ids(3)
    for u in (owner, admin, member):
        register(u, "phone")
    conv = sql("SELECT im.create_conversation('group', %s::bigint[], %s)", [admin, member], owner)[0][0]
    co = await Client.login(owner, "phone")
    ca = await Client.login(admin, "phone")
    cm = await Client.login(member, "phone")
    for c in (co, ca, cm):
        await c.bootstrap()
    r = await expect(co, {"type": "set_role", "conversation_id": conv, "target_user_id": admin,
                          "role": "admin", "client_msg_id": "role-1"}, "set_role_result")
    assert r["created"] is True, r
    # a plain member may not mute: FORBIDDEN (42501), no reason
    e = await expect(cm, {"type": "mute_member", "conversation_id": conv, "target_user_id": admin,
                          "muted_until": "2999-01-01T00:00:00Z", "client_msg_id": "mute-x"}, "error")
    assert e["code"] == "FORBIDDEN" and "reason" not in e, e
    # the admin mutes the member; the member's send is FORBIDDEN / muted
    r = await expect(ca, {"type": "mute_member", "conversation_id": conv, "target_user_id": member,
                          "muted_until": "2999-01-01T00:00:00Z", "client_msg_id": "mute-1"},
                     "mute_member_result")
    assert r["created"] is True, r
    e = await expect(cm, {"type": "send", "conversation_id": conv, "client_msg_id": "s-1",
                          "body": {"text": "muted"}}, "error")
    assert e["code"] == "FORBIDDEN" and e.get("reason") == "muted", e
    # reads go on for the muted member; its list shows the mute
    await expect(cm, {"type": "fetch_messages", "conversation_id": conv, "after_seq": 0},
                 "fetch_messages_result")
    lst = await expect(cm, {"type": "conversations"}, "conversations_result")
    mine = [x for x in lst["rows"] if x["conversation_id"] == conv]
    assert mine and mine[0]["my_role"] == "member" and mine[0]["muted_until"], mine
    # the mute position reaches the owner's device
    mutes = await wait_events(co, conv, lambda ev: ev["kind"] == "mute")
    assert mutes[-1]["body"]["user_id"] == member, mutes
    # unmute (no muted_until): the member sends again
    await expect(ca, {"type": "mute_member", "conversation_id": conv, "target_user_id": member,
                      "client_msg_id": "mute-2"}, "mute_member_result")
    s = await expect(cm, {"type": "send", "conversation_id": conv, "client_msg_id": "s-2",
                          "body": {"text": "free"}}, "send_result")
    assert s["created"] is True, s
    # the owner removes the member with a ban: a leave with removed_by
    r = await expect(co, {"type": "remove_member", "conversation_id": conv, "target_user_id": member,
                          "ban": True, "client_msg_id": "rm-1"}, "remove_member_result")
    assert r["created"] is True, r
    leaves = await wait_events(cm, conv, lambda ev: ev["kind"] == "leave")
    assert leaves[-1]["body"] == {"user_id": member, "removed_by": owner, "banned": True}, leaves
    e = await expect(cm, {"type": "send", "conversation_id": conv, "client_msg_id": "s-3",
                          "body": {"text": "gone"}}, "error")
    assert e["code"] == "FORBIDDEN" and "reason" not in e, e
    for c in (co, ca, cm):
        await c.close()


if __name__ == "__main__":
    sys.exit(run_tests([test_muted_member_forbidden], label="roles"))
