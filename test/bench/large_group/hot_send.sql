SELECT msg_seq FROM im.send_message(300001, :hot, 'h-' || pg_catalog.gen_random_uuid(), '{"text": "hot group"}');
