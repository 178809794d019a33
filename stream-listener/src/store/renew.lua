-- The steady-state heartbeat: renews one lease if nothing else needs a commit. O(log members).
-- KEYS: rev, leases, meta, members. ARGV: expected revision, memberId, session timeout ms, next timer ms
-- (-1: none).
-- Returns {1, now, min lease} when renewed, {0, now} when the caller must reload and commit.
-- A missing header or member record refuses too: a member must not extend its lease on metadata that was
-- lost (the revision and the leases may have survived it).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(redis.call('GET', KEYS[1]) or '0') ~= tonumber(ARGV[1]) then return {0, now} end
if redis.call('EXISTS', KEYS[3]) == 0 then return {0, now} end
if redis.call('HEXISTS', KEYS[4], ARGV[2]) == 0 then return {0, now} end
local mine = redis.call('ZSCORE', KEYS[2], ARGV[2])
if not mine or tonumber(mine) <= now then return {0, now} end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if tonumber(first[2]) <= now then return {0, now} end
local timer = tonumber(ARGV[4])
if timer >= 0 and timer <= now then return {0, now} end
redis.call('ZADD', KEYS[2], 'GT', now + tonumber(ARGV[3]), ARGV[2])
return {1, now, tonumber(first[2])}
