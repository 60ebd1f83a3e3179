-- Body number rule (contract §3): every number of a body of
-- send_message and edit_message, at any depth, lies within ±(2^53-1) and is
-- exactly the shortest decimal form of its nearest IEEE-754 double (I-JSON,
-- RFC 7493); anything else is 22023 and changes nothing.  \u0000 fails at
-- the jsonb cast (22P05) before any function runs.
\set VERBOSITY terse
\i sql/include/outcome.sql
-- everything a refused send must leave alone
CREATE FUNCTION pg_temp.state(c bigint) RETURNS text LANGUAGE sql AS $$
  SELECT format('head %s, events %s, outbox %s, bodies %s',
    (SELECT head_msg_seq FROM im.conversation WHERE conversation_id = c),
    (SELECT count(*) FROM im.event WHERE conversation_id = c),
    (SELECT count(*) FROM im.outbox WHERE conversation_id = c),
    (SELECT md5(string_agg(coalesce(body::text, '-'), ',' ORDER BY msg_seq)) FROM im.event WHERE conversation_id = c)) $$;

SELECT im.create_conversation('group', ARRAY[2101, 2102]::bigint[], 2101) AS c \gset

-- accepted: the boundaries and ordinary numbers, nested in arrays and objects
SELECT n AS number, pg_temp.outcome(format(
         $q$SELECT * FROM im.send_message(2101, %s, %L, '{"n": [1, {"x": %s}]}')$q$,
         :c, 'ok-' || n, n)) AS outcome
FROM unnest(ARRAY['0.1', '1.5', '-0', '0', '1e-300', '5e-324', '2.2250738585072014e-308',
                  '9007199254740991', '-9007199254740991', '123456789.125', '1E2', '3.14159']) AS n;
-- what is stored equals, as a decimal, what was sent
SELECT e.client_msg_id, (e.body->'n'->1->>'x')::numeric = substr(e.client_msg_id, 4)::numeric AS same_decimal
FROM im.event e WHERE e.conversation_id = :c AND e.kind = 'message' ORDER BY e.msg_seq;

-- refused: too large, not the shortest form of a double, out of double range
SELECT pg_temp.state(:c) AS before \gset
SELECT n AS number, pg_temp.outcome(format(
         $q$SELECT * FROM im.send_message(2101, %s, 'bad', '{"n": %s}')$q$, :c, n)) AS outcome
FROM unnest(ARRAY['1e19', '9007199254740993', '9007199254740992', '-9007199254740992',
                  '1e400', '-1e400', '1e-400', '0.10000000000000000001',
                  '0.1000000000000000055511151231257827', '1.7976931348623157e308',
                  '2e-324', '9007199254740990.5', '9007199254740990.25']) AS n;
-- at any depth: inside arrays, objects, arrays of objects, next to good numbers
SELECT b AS body, pg_temp.outcome(format(
         $q$SELECT * FROM im.send_message(2101, %s, 'bad', %L)$q$, :c, b)) AS outcome
FROM unnest(ARRAY['{"a": [1, 2, 1e19]}',
                  '{"a": {"b": {"c": {"d": 1e-400}}}}',
                  '{"a": [[[[0.10000000000000000001]]]]}',
                  '{"a": [{"ok": 0.5}, {"bad": 9007199254740993}]}',
                  '{"ok": 1, "s": "1e19 as a string is fine", "z": 1e19}']) AS b;
-- the whole error once, with its detail
\set VERBOSITY default
SELECT * FROM im.send_message(2101, :c, 'bad', '{"n": 1e19}');
\set VERBOSITY terse
-- nothing changed, and the refused client_msg_id is still free
SELECT pg_temp.state(:c) = :'before' AS unchanged;
SELECT created FROM im.send_message(2101, :c, 'bad', '{"n": "1e19"}');

-- edit_message applies the same rule; a refused edit leaves the target alone
SELECT message_id AS m FROM im.send_message(2101, :c, 'to-edit', '{"n": 1}') \gset
SELECT pg_temp.state(:c) AS before \gset
SELECT n AS number, pg_temp.outcome(format(
         $q$SELECT * FROM im.edit_message(2101, %s, 'edit-bad', %s, '{"n": [%s]}')$q$, :c, :m, n)) AS outcome
FROM unnest(ARRAY['1e19', '1e-400', '0.10000000000000000001', '9007199254740992']) AS n;
SELECT pg_temp.state(:c) = :'before' AS unchanged,
       (SELECT body FROM im.event WHERE message_id = :m) AS target_body;
SELECT created FROM im.edit_message(2101, :c, 'edit-ok', :m, '{"n": [0.1, -9007199254740991]}');
SELECT body FROM im.event WHERE message_id = :m;

-- strings are never numbers; numbers in keys do not exist in JSON
SELECT created FROM im.send_message(2101, :c, 'strings', '{"9007199254740993": "1e400", "n": "0.10000000000000000001"}');

-- \u0000 cannot be stored as jsonb: 22P05 at the cast, before send_message runs
SELECT pg_temp.outcome($q$SELECT '{"a": "\u0000"}'::jsonb$q$) AS cast_outcome;
SELECT pg_temp.outcome(format($q$SELECT * FROM im.send_message(2101, %s, 'nul', '{"a": "x\u0000y"}')$q$, :c)) AS send_outcome;
SELECT count(*) AS nul_sends FROM im.event WHERE client_msg_id = 'nul';
-- an escaped backslash before u0000 is an ordinary string
SELECT created FROM im.send_message(2101, :c, 'not-nul', '{"a": "\\u0000"}');
