\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.2'" to load this file. \quit

-- PLACEHOLDER on branch h11-rel only: the real 1.1 -> 1.2 script is the
-- "send" helper's (issue 10).  Here 1.2 is 1.1 unchanged, so 1.2 -> 1.3
-- (issue 11, reactions, pins and replies) has a chain to build on.
