\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.10'" to load this file. \quit


-- ---- trace ids (contract §21): the request's trace id kept with the
-- event and its outbox item while they are hot
ALTER TABLE im.event ADD COLUMN trace_id text;
ALTER TABLE im.outbox ADD COLUMN trace_id text;
