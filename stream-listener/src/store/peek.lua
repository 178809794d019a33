-- The writer's look at its next batch: whether it still has the lock (extending it), the store revision,
-- the store clock and up to a batch of queued heartbeats.
-- KEYS: writer, rev, inbox. ARGV: lock token, lock ms, batch size.
-- Returns {has_lock (0/1), revision, now, entry*}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0, 0, now} end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local reply = {1, tonumber(redis.call('GET', KEYS[2]) or '0'), now}
for _, entry in ipairs(redis.call('LRANGE', KEYS[3], 0, tonumber(ARGV[3]) - 1)) do
  reply[#reply + 1] = entry
end
return reply
