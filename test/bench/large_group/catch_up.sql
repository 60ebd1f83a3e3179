-- One device of member 2 catches up: sync batches until the user watermark
-- is reached; for each conversation_dirty event, fetch_messages from the
-- saved position to the target and clear_dirty.  Prints the number of
-- message positions obtained.
SELECT set_config('bench.dev', :'dev', false);
CREATE TEMP TABLE got (msg_seq bigint PRIMARY KEY);
DO $$
DECLARE l record; r record; ack bigint; gen int; tok text; cur text; ev jsonb; m jsonb; f record;
BEGIN
  SELECT sync_generation, server_acked_sync_seq INTO gen, ack
  FROM im.device_session(2, current_setting('bench.dev'), 0);
  LOOP
    cur := NULL;
    SELECT * INTO r FROM im.sync_changes(2, current_setting('bench.dev'), gen, ack, 1000, NULL);
    tok := r.batch_token;
    LOOP
      FOR ev IN SELECT * FROM jsonb_array_elements(r.events) LOOP
        IF ev->>'kind' = 'message' THEN
          INSERT INTO got VALUES ((ev->>'msg_seq')::bigint) ON CONFLICT DO NOTHING;
        ELSIF ev->>'kind' = 'conversation_dirty' THEN
          -- level-triggered: read the marker, fetch up to its target, clear
          -- with its version; a newer message makes the clear fail: repeat
          LOOP
            SELECT * INTO l FROM im.conversation_list(2, 1, (ev->>'conversation_id')::bigint - 1);
            FOR f IN SELECT * FROM im.fetch_messages(2, l.conversation_id,
                                coalesce((SELECT max(msg_seq) FROM got), 0), 1000, l.dirty_target_msg_seq) LOOP
              INSERT INTO got SELECT (x->>'msg_seq')::bigint FROM jsonb_array_elements(f.messages) x
                WHERE x->>'kind' = 'message' ON CONFLICT DO NOTHING;
            END LOOP;
            EXIT WHEN (SELECT cleared FROM im.clear_dirty(2, l.conversation_id, l.dirty_version,
                                                           l.dirty_target_msg_seq));
          END LOOP;
        END IF;
      END LOOP;
      EXIT WHEN NOT r.has_more;
      SELECT * INTO r FROM im.sync_changes(2, current_setting('bench.dev'), gen, ack, 1000, r.next_cursor);
    END LOOP;
    PERFORM im.ack_sync(2, current_setting('bench.dev'), tok, r.batch_high_watermark);
    ack := r.batch_high_watermark;
    EXIT WHEN r.user_high_watermark <= ack;
  END LOOP;
END $$;
SELECT count(*) FROM got;
