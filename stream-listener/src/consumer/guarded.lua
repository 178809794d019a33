-- Runs commands on shard stream KEYS[1] only while its fence KEYS[2] holds exactly the caller's fencing
-- token ARGV[1] (written by fence.lua when the member took the shard). A command that reaches Redis after
-- another owner fenced the shard (sent by a process paused with it queued) is refused, not run. A missing
-- fence (Redis lost it) is refused as 'SLFENCED missing': the owner fences again, a member whose lease
-- passed cannot (it checks its deadline before every command).
-- ARGV[2..]: the commands, each as its argument count, then its arguments. Returns the last one's reply,
-- or the first error. A read (XREADGROUP) that finds nothing returns {'idle', id} instead: the id of the
-- stream's last entry, taken atomically with the empty read, which the idle wait blocks past.
local fence = redis.call('GET', KEYS[2])
if fence ~= ARGV[1] then
  return redis.error_reply(fence and 'SLFENCED the shard is fenced by another owner' or 'SLFENCED missing')
end
local i, reply, name = 2, nil, nil
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  name = ARGV[i + 1]
  reply = redis.pcall(unpack(ARGV, i + 1, i + n))
  if type(reply) == 'table' and reply.err then return reply end
  i = i + n + 1
end
if name == 'XREADGROUP' and not reply then
  local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
  return {'idle', last and last[1] or '0-0'}
end
return reply
