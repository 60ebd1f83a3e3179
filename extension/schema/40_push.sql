-- ---- offline push: targets, notification settings, presence and the push
-- queue (contract §13; push/).  Everything here is on the user side of the
-- seam.

CREATE SEQUENCE im.push_target_id_seq;
CREATE SEQUENCE im.push_job_id_seq;

-- One push target per device.  The token is never stored in the clear:
-- sealed_token is sealed with the relay's public key, token_digest is a
-- keyed digest (im.push_secret) that finds the same token on another device.
CREATE TABLE im.push_target (
    push_target_id bigint PRIMARY KEY DEFAULT nextval('im.push_target_id_seq'),
    user_id        bigint NOT NULL,
    device_id      text   NOT NULL,
    provider       text   NOT NULL CHECK (provider ~ '^[a-z0-9_-]{1,32}$'),
    app_id         text   NOT NULL CHECK (length(app_id) BETWEEN 1 AND 64),
    token_digest   bytea  NOT NULL CHECK (octet_length(token_digest) = 32),
    sealed_token   text   NOT NULL,
    preview        text   NOT NULL DEFAULT 'none' CHECK (preview IN ('none', 'sender', 'full')),
    rejections     int    NOT NULL DEFAULT 0,
    disabled_at    timestamptz,
    registered_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (user_id, device_id),
    UNIQUE (provider, app_id, token_digest),
    FOREIGN KEY (user_id, device_id) REFERENCES im.device
);

-- The key of token_digest: one random row, readable by the extension owner only.
CREATE TABLE im.push_secret (
    secret_id  int PRIMARY KEY CHECK (secret_id = 1),
    digest_key bytea NOT NULL CHECK (octet_length(digest_key) = 32),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Notification settings: conversation_id 0 is the account default, any
-- other a conversation override.  A NULL field is unset (resolves to the
-- account's, then to unmuted / 'full').
CREATE TABLE im.notify_setting (
    user_id         bigint NOT NULL,
    conversation_id bigint NOT NULL CHECK (conversation_id >= 0),
    mute_until      timestamptz,
    preview         text CHECK (preview IN ('none', 'sender', 'full')),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, conversation_id)
);

-- Presence written by the gateway: a device is online while a row of its
-- current connection epoch has not expired.
CREATE TABLE im.presence (
    user_id          bigint NOT NULL,
    device_id        text   NOT NULL,
    connection_epoch bigint NOT NULL,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (user_id, device_id),
    FOREIGN KEY (user_id, device_id) REFERENCES im.device ON DELETE CASCADE
);

-- The push queue.  pending/retry jobs coalesce per (target, conversation);
-- claimed jobs carry a lease; delivered, dead, expired, suppressed and
-- target_disabled are final (collected after im_sync.push_max_age).
CREATE TABLE im.push_job (
    job_id          bigint PRIMARY KEY DEFAULT nextval('im.push_job_id_seq'),
    push_target_id  bigint NOT NULL REFERENCES im.push_target ON DELETE CASCADE,
    user_id         bigint NOT NULL,
    device_id       text   NOT NULL,
    conversation_id bigint NOT NULL,
    message_id      bigint NOT NULL,
    msg_seq         bigint NOT NULL,
    sync_seq        bigint NOT NULL,   -- the event's place in the user's log: an ACK at or past it suppresses
    state           text   NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'claimed', 'retry', 'delivered', 'dead', 'expired',
                                     'suppressed', 'target_disabled')),
    coalesced       int    NOT NULL DEFAULT 0,
    attempts        int    NOT NULL DEFAULT 0,
    queued_at       timestamptz NOT NULL DEFAULT now(),
    not_before      timestamptz NOT NULL,
    relay_id        text,
    claimed_at      timestamptz,       -- the last hand-out: a rejection counts only against the token sent then
    lease_until     timestamptz,
    last_result     text CHECK (last_result IN ('delivered', 'rejected', 'rate_limited', 'transient', 'permanent')),
    http_status     int,
    provider_ref    text,
    finished_at     timestamptz,
    trace_id        text               -- the trace id of the message it names (contract §21)
);
CREATE UNIQUE INDEX push_job_coalesce ON im.push_job (push_target_id, conversation_id)
    WHERE state IN ('pending', 'retry');
CREATE INDEX push_job_due ON im.push_job (not_before) WHERE state IN ('pending', 'retry');
CREATE INDEX push_job_leased ON im.push_job (lease_until) WHERE state = 'claimed';
CREATE INDEX push_job_finished ON im.push_job (finished_at) WHERE finished_at IS NOT NULL;

-- When each (target, conversation) was last handed to a relay
-- (im_sync.push_min_interval).
CREATE TABLE im.push_pace (
    push_target_id  bigint NOT NULL REFERENCES im.push_target ON DELETE CASCADE,
    conversation_id bigint NOT NULL,
    last_claimed_at timestamptz NOT NULL,
    PRIMARY KEY (push_target_id, conversation_id)
);

SELECT pg_catalog.pg_extension_config_dump('im.push_target', '');
SELECT pg_catalog.pg_extension_config_dump('im.push_secret', '');
SELECT pg_catalog.pg_extension_config_dump('im.notify_setting', '');
SELECT pg_catalog.pg_extension_config_dump('im.presence', '');
SELECT pg_catalog.pg_extension_config_dump('im.push_job', '');
SELECT pg_catalog.pg_extension_config_dump('im.push_pace', '');
SELECT pg_catalog.pg_extension_config_dump('im.push_target_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('im.push_job_id_seq', '');

CREATE FUNCTION im.register_push_target(user_id bigint, device_id text, provider text,
                                        app_id text, push_token text, preview text DEFAULT 'none')
RETURNS bigint AS 'MODULE_PATHNAME', 'im_register_push_target' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.remove_push_target(user_id bigint, device_id text)
RETURNS boolean AS 'MODULE_PATHNAME', 'im_remove_push_target' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.set_notify(user_id bigint, conversation_id bigint DEFAULT NULL,
                              mute_until timestamptz DEFAULT NULL, preview text DEFAULT NULL,
                              clear boolean DEFAULT false)
RETURNS void AS 'MODULE_PATHNAME', 'im_set_notify' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.set_presence(user_id bigint, device_id text, connection_epoch bigint,
                                online boolean, ttl interval DEFAULT '90 seconds')
RETURNS boolean AS 'MODULE_PATHNAME', 'im_set_presence' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.refresh_presence(user_ids bigint[], device_ids text[], connection_epochs bigint[],
                                    ttl interval DEFAULT '90 seconds')
RETURNS int AS 'MODULE_PATHNAME', 'im_refresh_presence' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.claim_push_jobs(relay_id text, max_jobs int DEFAULT 100,
                                   lease interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, push_target_id bigint, provider text,
              app_id text, sealed_token text, notification jsonb, trace_id text)
AS 'MODULE_PATHNAME', 'im_claim_push_jobs' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.complete_push_job(job_id bigint, relay_id text, result text,
                                     http_status int DEFAULT NULL, retry_after_ms int DEFAULT NULL,
                                     provider_ref text DEFAULT NULL)
RETURNS text AS 'MODULE_PATHNAME', 'im_complete_push_job' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;

COMMENT ON TABLE im.push_target IS 'One push target per device: provider, app_id, the token sealed for the relay and its keyed digest (contract §13)';
COMMENT ON TABLE im.push_secret IS 'The key of push_target.token_digest, readable by the extension owner only (contract §13, §12)';
COMMENT ON TABLE im.notify_setting IS 'Account (conversation_id 0) and per-conversation notification settings: mute and preview (contract §13)';
COMMENT ON TABLE im.presence IS 'Devices connected to a gateway: a lease per current connection epoch (contract §13)';
COMMENT ON TABLE im.push_job IS 'The push queue filled by fanout and drained by relays under leases (contract §13)';
COMMENT ON TABLE im.push_pace IS 'When each (target, conversation) was last handed to a relay, for im_sync.push_min_interval (contract §13)';
COMMENT ON FUNCTION im.register_push_target(bigint, text, text, text, text, text) IS 'Registers a device''s push target, its token sealed for the relay (contract §13)';
COMMENT ON FUNCTION im.remove_push_target(bigint, text) IS 'Removes a device''s push target and its jobs (contract §13)';
COMMENT ON FUNCTION im.set_notify(bigint, bigint, timestamp with time zone, text, boolean) IS 'Sets the account''s or a conversation''s mute and preview (contract §13)';
COMMENT ON FUNCTION im.set_presence(bigint, text, bigint, boolean, interval) IS 'Marks a device online or offline for its current connection epoch (contract §13)';
COMMENT ON FUNCTION im.refresh_presence(bigint[], text[], bigint[], interval) IS 'Renews the presence leases of many sessions (contract §13)';
COMMENT ON FUNCTION im.claim_push_jobs(text, integer, interval) IS 'Hands claimable push jobs to a relay under a lease, each with the trace id of its message (contract §13, §21)';
COMMENT ON FUNCTION im.complete_push_job(bigint, text, text, integer, integer, text) IS 'Records a relay''s result for a push job and returns its state after (contract §13)';
