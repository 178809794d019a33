-- Runs command ARGV[1] on shard stream KEYS[1] with arguments ARGV[2..] only while this ownership's fence
-- KEYS[2] exists: a claim that reaches Redis after the next owner took the shard is refused (see fence.rs).
if redis.call('EXISTS', KEYS[2]) == 0 then
  return redis.error_reply('FENCED ' .. KEYS[2] .. ' is gone: a newer owner took the shard, or Redis lost it')
end
return redis.call(ARGV[1], KEYS[1], unpack(ARGV, 2))
