-- im.members_among: the subset of the named users with an
-- active membership period, nobody else; leavers and non-members are left
-- out; a role granted only members_among cannot call conversation_members.
SET client_min_messages = warning;
DROP DATABASE IF EXISTS im_members_among;
DROP ROLE IF EXISTS im_gw_among;
RESET client_min_messages;
CREATE DATABASE im_members_among;
\c im_members_among
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync;
RESET client_min_messages;
SELECT im.create_conversation('group', ARRAY[1, 2, 3, 4]::bigint[], 1) AS g \gset
SELECT membership_period_id IS NOT NULL AS left FROM im.leave_conversation(:g, 3);
-- 3 left, 5 never joined, 4 not asked for
SELECT * FROM im.members_among(:g, ARRAY[1, 2, 3, 5]::bigint[]);
SELECT count(*) FROM im.members_among(:g, ARRAY[]::bigint[]);
SELECT count(*) FROM im.members_among(:g, NULL);
SELECT count(*) FROM im.members_among(999999, ARRAY[1, 2]::bigint[]);
-- rejoined: active again
SELECT created FROM im.join_conversation(:g, 3);
SELECT * FROM im.members_among(:g, ARRAY[3]::bigint[]);
-- the gateway's grant: members_among without conversation_members
CREATE ROLE im_gw_among LOGIN;
GRANT USAGE ON SCHEMA im TO im_gw_among;
GRANT EXECUTE ON FUNCTION im.members_among(bigint, bigint[]) TO im_gw_among;
SET ROLE im_gw_among;
SELECT * FROM im.members_among(:g, ARRAY[1, 4]::bigint[]);
\set VERBOSITY terse
SELECT * FROM im.conversation_members(:g);
\set VERBOSITY default
RESET ROLE;
-- SECURITY DEFINER with a pinned search_path, like every API function
SELECT prosecdef, proconfig FROM pg_proc WHERE oid = 'im.members_among'::regproc;
DROP OWNED BY im_gw_among;
DROP ROLE im_gw_among;
