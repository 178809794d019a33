-- Ends a shrink's drain once every removed shard stream is gone: the record stops listing them.
-- KEYS: record, audit stream
-- ARGV: the draining count the caller saw
-- Returns the record's fields (see FIELDS), nil when the record does not exist.
local draining = redis.call('HGET', KEYS[1], 'drainingShardCount')
if draining and draining == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'drainingShardCount')
  local t = redis.call('TIME')
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'event', 'SHARDS_RETIRED',
    'from', draining, 'to', redis.call('HGET', KEYS[1], 'shardCount'),
    'version', redis.call('HGET', KEYS[1], 'version'),
    'atMs', string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
end
if not redis.call('HGET', KEYS[1], 'shardCount') then
  return false
end
return redis.call('HMGET', KEYS[1], 'shardCount', 'version', 'previousShardCount', 'resizedAtMs', 'graceMs',
  'drainingShardCount', 'lastResize')
