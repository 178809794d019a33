-- Creates a stream's topology record with ARGV[1] shards if absent.
-- KEYS: record
-- Returns the record's fields (see FIELDS; the existing ones if present).
local n = redis.call('HGET', KEYS[1], 'shardCount')
if not n then
  redis.call('HSET', KEYS[1], 'shardCount', ARGV[1], 'version', '1')
end
return redis.call('HMGET', KEYS[1], 'shardCount', 'version', 'previousShardCount', 'resizedAtMs', 'graceMs',
  'drainingShardCount', 'lastResize')
