-- Releases the group's writer lock if this process still has it, and wakes one waiting writer.
-- KEYS: writer, turn. ARGV: token, turn ttl ms.
-- The lock only serializes writers so they do not collide; the revision compare-and-set in commit.lua
-- remains the safety guard (a writer that paused past the lock's expiry is refused there).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
redis.call('DEL', KEYS[2])
redis.call('RPUSH', KEYS[2], '1')
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
