-- Reads a group's metadata header, store revision, leases and member records, with the store clock.
-- KEYS: meta, rev, leases, members
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local meta = redis.call('GET', KEYS[1])
local rev = tonumber(redis.call('GET', KEYS[2]) or '0')
return {meta, rev, redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES'), now, redis.call('HGETALL', KEYS[4])}
