-- Queues a heartbeat for whichever process has the writer lock, and takes the lock if it is free (a
-- sender over a slow link, ARGV[6] = 0, only when no other heartbeat is queued: it leaves the others'
-- to faster writers).
-- KEYS: inbox, writer. ARGV: reply id, heartbeat JSON, ttl ms (how long the sender waits for an answer),
-- lock token, lock ms, whether to take the lock (1/0).
-- The entry is "<deadline ms> <reply id> <heartbeat JSON>"; a writer never applies an entry past its
-- deadline (its sender stopped waiting). Returns {1 if this call took the lock else 0, now}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('RPUSH', KEYS[1], string.format('%d', now + ttl) .. ' ' .. ARGV[1] .. ' ' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.max(ttl * 4, 10000))
if ARGV[6] == '0' and redis.call('LLEN', KEYS[1]) > 1 then return {0, now} end
local taken = redis.call('SET', KEYS[2], ARGV[4], 'NX', 'PX', ARGV[5])
if taken then return {1, now} end
return {0, now}
