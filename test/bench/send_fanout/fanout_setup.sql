-- Fanout fixture (database im_test, workers paused, outbox drained): a
-- 200-member group, its create event fanned out, then :nmsg messages left
-- pending for the workers.
CREATE TABLE bench.g AS
SELECT im.create_conversation('group', ARRAY(SELECT pg_catalog.generate_series(500001, 500200))::bigint[], 500001) AS conversation_id;
SELECT im.run_fanout() AS create_fanned_out;
SELECT pg_catalog.count(*) AS sent
  FROM pg_catalog.generate_series(1, :nmsg) k,
       LATERAL im.send_message(500001 + k % 200, (SELECT conversation_id FROM bench.g),
                               'fan-' || k, '{"text": "fanout benchmark"}'::jsonb) m;
VACUUM ANALYZE;
