-- The least grants of the gateway role (README "Grants"): EXECUTE on the
-- device-facing API functions it calls, no table privileges, and no
-- function that lists a conversation's members (im.members_among names only
-- the users the gateway asks about).  60-e2e runs a gateway as this role.
DO $$BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'im_gateway_e2e') THEN
    CREATE ROLE im_gateway_e2e LOGIN;
  END IF;
END$$;
GRANT USAGE ON SCHEMA im TO im_gateway_e2e;
GRANT EXECUTE ON FUNCTION
  im.authenticate(text), im.device_session(bigint, text, bigint),
  im.sync_changes(bigint, text, int, bigint, int, text), im.ack_sync(bigint, text, text, bigint),
  im.send_message(bigint, bigint, text, jsonb, text, bigint, text), im.recall_message(bigint, bigint, text, bigint, text),
  im.edit_message(bigint, bigint, text, bigint, jsonb, text), im.report_read(bigint, bigint, bigint, text),
  im.fetch_messages(bigint, bigint, bigint, int, bigint), im.conversation_list(bigint, int, bigint),
  im.members_among(bigint, bigint[]),
  im.clear_dirty(bigint, bigint, bigint, bigint, text), im.delete_for_me(bigint, bigint, bigint, text),
  im.begin_snapshot(bigint, text), im.fetch_snapshot(bigint, text, text, int),
  im.ack_snapshot(bigint, text, text, text), im.metrics(),
  im.react(bigint, bigint, bigint, text, boolean, text, text), im.pin_message(bigint, bigint, bigint, boolean, text, text),
  im.message_facts(bigint, bigint)
TO im_gateway_e2e;
-- recency and conversation pins (contract §20)
GRANT EXECUTE ON FUNCTION
  im.recent_conversations(bigint, int, text), im.pin_conversation(bigint, bigint, boolean, text),
  im.set_read_receipts(bigint, boolean, text)
TO im_gateway_e2e;
-- roles, mutes, removals: the frames set_role, mute_member, remove_member (contract §17)
GRANT EXECUTE ON FUNCTION
  im.set_member_role(bigint, bigint, bigint, text, text),
  im.mute_member(bigint, bigint, bigint, timestamptz, text),
  im.remove_member(bigint, bigint, bigint, boolean, text)
TO im_gateway_e2e;
-- push: presence (contract §13)
GRANT EXECUTE ON FUNCTION
  im.set_presence(bigint, text, bigint, boolean, interval),
  im.refresh_presence(bigint[], text[], bigint[], interval)
TO im_gateway_e2e;
