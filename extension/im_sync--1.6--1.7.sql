\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.7'" to load this file. \quit
