\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.11'" to load this file. \quit

