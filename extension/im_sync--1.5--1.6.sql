\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.6'" to load this file. \quit

/*
 * ---- 1.5 -> 1.6.  The blocks below are appended verbatim, without this
 * file's \echo line, to the 1.5 full script to make im_sync--1.6.sql, so the
 * two reach the same catalog (test/suites/70-upgrade.sh compares them).
 */
