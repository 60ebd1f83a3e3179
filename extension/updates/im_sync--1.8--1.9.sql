\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.9'" to load this file. \quit

-- ---- 1.8 -> 1.9: second hardening round (docs: README "Security")
