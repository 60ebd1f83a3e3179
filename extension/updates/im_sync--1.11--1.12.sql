\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.12'" to load this file. \quit

