\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.4'" to load this file. \quit

/*
 * ---- 1.3 -> 1.4.  Each block below (issue 12: offline push, contract §13;
 * issue 13: message_facts, contract §16) is appended verbatim, without this
 * file's \echo line, to the 1.3 full script to make im_sync--1.4.sql, so the
 * two reach the same catalog (test/suites/70-upgrade.sh compares them).
 */
