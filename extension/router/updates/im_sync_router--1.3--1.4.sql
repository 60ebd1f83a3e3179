\echo Use "ALTER EXTENSION im_sync_router UPDATE TO '1.4'" to load this file. \quit

