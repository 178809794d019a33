-- The lag exporter's read of one group on one shard stream, in one call (one moment, one node's clock).
-- KEYS: the shard stream. ARGV: group, the most entries to count when Redis cannot tell the lag.
-- Reply: {exists, hasGroup, length, entriesAdded, entriesRead, lag, pending, oldestPendingId,
--         lastDeliveredId, firstUndeliveredId, counted, nowMs}; -1 for a count Redis does not know, '' for
--         no id. `counted` (-1 unless Redis reports no lag): the entries after the last delivered id,
--         at most limit + 1 of them (more than limit: the lag is at least limit).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return {0, 0, 0, -1, -1, -1, 0, '', '', '', -1, now}
end
if kind ~= 'stream' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is a ' .. kind .. ', not a stream')
end
local function field(flat, name)
  for i = 1, #flat, 2 do
    if flat[i] == name then return flat[i + 1] end
  end
  return nil
end
local function count(v)
  if type(v) == 'number' then return v end
  return -1
end
local stream = redis.call('XINFO', 'STREAM', KEYS[1])
local length = count(field(stream, 'length'))
local added = count(field(stream, 'entries-added'))
local info = nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  if field(g, 'name') == ARGV[1] then
    info = g
    break
  end
end
if not info then
  return {1, 0, length, added, -1, -1, 0, '', '', '', -1, now}
end
local last = field(info, 'last-delivered-id')
local read = count(field(info, 'entries-read'))
local lag = count(field(info, 'lag'))
local summary = redis.call('XPENDING', KEYS[1], ARGV[1])
local pending = summary[1]
local oldest = summary[2] or ''
-- '(' + the greatest id is refused by Redis: nothing can follow it.
local ok, first = pcall(redis.call, 'XRANGE', KEYS[1], '(' .. last, '+', 'COUNT', 1)
local first_id = ''
if ok and first[1] then first_id = first[1][1] end
local counted = -1
if lag < 0 then
  if first_id == '' then
    counted = 0
  else
    counted = #redis.call('XRANGE', KEYS[1], '(' .. last, '+', 'COUNT', tonumber(ARGV[2]) + 1)
  end
end
return {1, 1, length, added, read, lag, pending, oldest, last, first_id, counted, now}
