\echo Use "ALTER EXTENSION im_sync_router UPDATE TO '1.4'" to load this file. \quit

-- ---- receipts through the router (contract §20)
-- contract §20: receipts; set_read_receipts on the user's node, run_receipts
-- on every node (a receipt is produced on the reader's node and carried to
-- the sender's by a transfer, so a round runs every node's producer)
CREATE FUNCTION im_router.set_read_receipts(user_id bigint, enabled boolean, trace_id text DEFAULT NULL)
RETURNS TABLE(read_receipts boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.set_read_receipts; $$;

CREATE FUNCTION im_router.all_run_receipts(max_rows int) RETURNS SETOF bigint
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_all(); TARGET im.run_receipts; $$;

-- run_receipts: one producer pass on every node; the receipts written in all
CREATE FUNCTION im_router.run_receipts(max_rows int DEFAULT 10000) RETURNS bigint
LANGUAGE sql
SET search_path = pg_catalog, im_router, pg_temp
AS $$ SELECT coalesce(sum(n), 0)::bigint FROM im_router.all_run_receipts(max_rows) n $$;

SELECT im_router.create_api_wrapper('im_router.set_read_receipts(bigint, boolean, text)'::regprocedure);
SELECT im_router.create_api_wrapper('im_router.run_receipts(int)'::regprocedure);
REVOKE ALL ON FUNCTION im.set_read_receipts(bigint, boolean, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.run_receipts(int) FROM PUBLIC;
