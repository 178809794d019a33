-- Sets the shard count of a stream's topology record, bumps the version and records the migration.
-- KEYS: record, audit stream
-- ARGV: new shard count, grace ms, kind ('resize' | 'rollback'), expected version ('' = any)
-- Returns the record's fields (see FIELDS), nil when the record does not exist, {'wait', cut} while the
-- previous migration's grace has not passed, {'changed', version} when the version is not the expected
-- one, {'draining', count} while the removed shards of the last shrink are not retired.
local n = redis.call('HGET', KEYS[1], 'shardCount')
if not n then
  return false
end
local v = redis.call('HGET', KEYS[1], 'version') or '0'
if ARGV[4] ~= '' and v ~= ARGV[4] then
  return {'changed', v}
end
if n ~= ARGV[1] then
  if not tonumber(v) then
    return redis.error_reply('ERR corrupt topology version ' .. v)
  end
  local draining = redis.call('HGET', KEYS[1], 'drainingShardCount')
  if draining then
    return {'draining', draining}
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local at = tonumber(redis.call('HGET', KEYS[1], 'resizedAtMs') or '')
  local grace = tonumber(redis.call('HGET', KEYS[1], 'graceMs') or '')
  if at and grace and now < at + grace then
    return {'wait', string.format('%d', at + grace)}
  end
  local nows = string.format('%d', now)
  redis.call('HSET', KEYS[1], 'shardCount', ARGV[1], 'previousShardCount', n,
    'resizedAtMs', nows, 'graceMs', ARGV[2], 'lastResize', ARGV[3])
  if tonumber(ARGV[1]) < tonumber(n) then
    -- A shrink: the removed shards stay readable until every group consumed them past the cut.
    redis.call('HSET', KEYS[1], 'drainingShardCount', n)
  end
  local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*',
    'event', ARGV[3] == 'rollback' and 'ROLLED_BACK' or 'RESIZED',
    'from', n, 'to', ARGV[1], 'version', version, 'graceMs', ARGV[2], 'atMs', nows)
end
return redis.call('HMGET', KEYS[1], 'shardCount', 'version', 'previousShardCount', 'resizedAtMs', 'graceMs',
  'drainingShardCount', 'lastResize')
