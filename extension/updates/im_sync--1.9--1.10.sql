\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.10'" to load this file. \quit

