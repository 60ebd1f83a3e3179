\echo Use "ALTER EXTENSION im_sync_router UPDATE TO '1.3'" to load this file. \quit

