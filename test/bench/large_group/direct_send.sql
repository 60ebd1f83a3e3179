\set g random(1, 500)
SELECT msg_seq FROM im.send_message(100000 + :g, im.direct_conversation(100000 + :g, 200000 + :g), 'd-' || pg_catalog.gen_random_uuid(), '{"text": "hi"}');
