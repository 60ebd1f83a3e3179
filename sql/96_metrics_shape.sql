-- im.metrics() (contract §21): every row is a well-formed Prometheus
-- series — a bare name, a type, labels as a jsonb object of strings — and
-- every histogram family is complete: _bucket rows with le labels
-- increasing and a last "+Inf" bucket equal to _count, cumulative, and
-- _sum and _count rows; all three of type histogram.  Checked on a
-- database with data in every histogram, including a repaired gap.
SELECT setval('im.conversation_id_seq', 9600) IS NOT NULL AS pinned,
       setval('im.event_id_seq', 96000) IS NOT NULL AS pinned_events;
SELECT pg_get_function_result('im.metrics()'::regprocedure);
SELECT im.create_conversation('group', ARRAY[9601, 9602, 9603]::bigint[], 9601) AS c \gset
SELECT count(*) AS sent FROM generate_series(1, 3) i, im.send_message(9601, :c, 'shape-' || i, '{"text": "x"}');
SELECT im.run_fanout() > 0 AS fanned_out;
-- a gap: one recipient's event vanishes; repair_fanout requeues it, and
-- im_gaps_repaired_total counts it once committed
SELECT value AS repaired_before FROM im.metrics()
 WHERE name = 'im_gaps_repaired_total' AND labels = '{"kind": "missing_delivery"}' \gset
DELETE FROM im.inbox WHERE user_id = 9603 AND source_event_id = (SELECT max(message_id) FROM im.event WHERE conversation_id = :c);
SELECT action, user_id FROM im.repair_fanout() WHERE user_id = 9603;
SELECT im.run_fanout() > 0 AS refanned;
SELECT value - :repaired_before AS repaired FROM im.metrics()
 WHERE name = 'im_gaps_repaired_total' AND labels = '{"kind": "missing_delivery"}';
-- a rolled-back repair counts nothing
DELETE FROM im.inbox WHERE user_id = 9603 AND source_event_id = (SELECT max(message_id) FROM im.event WHERE conversation_id = :c);
BEGIN;
SELECT count(*) AS requeued FROM im.repair_fanout() WHERE action = 'requeued';
ROLLBACK;
SELECT value - :repaired_before AS repaired_after_rollback FROM im.metrics()
 WHERE name = 'im_gaps_repaired_total' AND labels = '{"kind": "missing_delivery"}';
SELECT count(*) AS requeued FROM im.repair_fanout() WHERE action = 'requeued';
SELECT im.run_fanout() > 0 AS refanned;

CREATE TEMP TABLE m AS SELECT * FROM im.metrics() WITH ORDINALITY m(name, value, help, type, labels, ord);
-- names, types, help, labels
SELECT count(*) AS rows_badly_named FROM m WHERE name !~ '^[a-zA-Z_:][a-zA-Z0-9_:]*$';
SELECT count(*) AS rows_bad_type FROM m WHERE type IS NULL OR type NOT IN ('counter', 'gauge', 'histogram');
SELECT count(*) AS rows_without_help FROM m WHERE help IS NULL OR help = '';
SELECT name FROM m WHERE type = 'counter' AND name !~ '_total$';
SELECT name FROM m WHERE type <> 'counter' AND name ~ '_total$';
SELECT count(*) AS bad_labels FROM m
 WHERE labels IS NOT NULL
   AND (jsonb_typeof(labels) <> 'object' OR labels = '{}'
        OR EXISTS (SELECT 1 FROM jsonb_each(labels) l
                    WHERE jsonb_typeof(l.value) <> 'string' OR l.key !~ '^[a-zA-Z_][a-zA-Z0-9_]*$'
                       OR l.key LIKE '\_\_%'));
-- one series per (name, labels)
SELECT name, labels FROM m GROUP BY name, labels HAVING count(*) > 1;
-- one type and one help per name
SELECT name FROM m GROUP BY name HAVING count(DISTINCT type) > 1 OR count(DISTINCT help) > 1;
-- histograms: base name of each family, its rows
CREATE TEMP VIEW h AS
  SELECT regexp_replace(name, '_(bucket|sum|count)$', '') AS family, name, labels, value, ord FROM m
   WHERE type = 'histogram';
SELECT family,
       count(*) FILTER (WHERE name = family || '_bucket') AS buckets,
       count(*) FILTER (WHERE name = family || '_sum') AS sums,
       count(*) FILTER (WHERE name = family || '_count') AS counts
  FROM h GROUP BY family ORDER BY family;
SELECT name FROM h WHERE name NOT IN (family || '_bucket', family || '_sum', family || '_count');
-- only le on buckets; _sum and _count carry none
SELECT family, name FROM h
 WHERE (name LIKE '%\_bucket' AND (labels IS NULL OR (SELECT array_agg(k) FROM jsonb_object_keys(labels) k) <> '{le}'))
    OR (name NOT LIKE '%\_bucket' AND labels IS NOT NULL);
-- le strictly increasing in row order, the last one +Inf, counts cumulative
SELECT family, count(*) AS bad_steps FROM (
  SELECT family, labels->>'le' AS le, value,
         lag(labels->>'le') OVER w AS prev_le, lag(value) OVER w AS prev_value
    FROM h WHERE name LIKE '%\_bucket' WINDOW w AS (PARTITION BY family ORDER BY ord)) b
 WHERE prev_le IS NOT NULL
   AND (prev_le = '+Inf' OR (le <> '+Inf' AND le::float8 <= prev_le::float8) OR value < prev_value)
 GROUP BY family;
SELECT family, (SELECT labels->>'le' FROM h h2 WHERE h2.family = h.family AND h2.name LIKE '%\_bucket'
                 ORDER BY ord DESC LIMIT 1) AS last_le,
       (SELECT value FROM h h2 WHERE h2.family = h.family AND h2.labels->>'le' = '+Inf')
         = (SELECT value FROM h h2 WHERE h2.family = h.family AND h2.name = h.family || '_count') AS inf_is_count
  FROM (SELECT DISTINCT family FROM h) h ORDER BY family;
-- fanout amplification saw this world: four events (the creation and three
-- messages) of three rows each
SELECT labels->>'le' AS le, value FROM m WHERE name = 'im_fanout_amplification_rows_bucket' ORDER BY ord;
SELECT name, value FROM m WHERE name IN ('im_fanout_amplification_rows_sum', 'im_fanout_amplification_rows_count') ORDER BY name;
-- refused transfers (none here); every replication slot of the server,
-- labelled with its name
SELECT name, type, value FROM m WHERE name IN ('im_transfers_refused') ORDER BY name;
SELECT count(*) AS slot_rows FROM m WHERE name = 'im_replication_slot_retained_bytes';
SELECT slot_name IS NOT NULL AS slot FROM pg_create_physical_replication_slot('im_shape_slot', true);
SELECT type, labels, value >= 0 AS bytes FROM im.metrics() WHERE name = 'im_replication_slot_retained_bytes';
SELECT pg_drop_replication_slot('im_shape_slot');
-- labels never spelled into a name
SELECT count(*) AS names_with_braces FROM m WHERE name LIKE '%{%';
