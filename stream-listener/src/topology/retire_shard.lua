-- One removed shard of a shrink (KEYS[1]), past the cut ARGV[1] (ms): freeze it, and retire it once every
-- consumer group consumed it to the end.
-- Freezing sets the stream's last id to the largest possible one, so every later XADD fails loudly ("The
-- stream has exhausted the last possible ID") instead of adding an entry after the groups finished; the
-- entries already there stay readable. Retiring trims it to nothing but keeps the (frozen) stream and its
-- groups, so members that still own the shard until their group follows read nothing, rather than
-- failing with NOGROUP (and recreating the stream). A later grow deletes it before reusing the index.
-- Returns {'gone' | 'wait' | 'draining' | 'retired', blocking group or ''}.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'gone', ''}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < tonumber(ARGV[1]) then
  return {'wait', ''}
end
redis.call('XSETID', KEYS[1], '18446744073709551615-18446744073709551615')
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
local function older(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, aseq, bms, bseq = tonumber(ams), tonumber(aseq), tonumber(bms), tonumber(bseq)
  return ams < bms or (ams == bms and aseq < bseq)
end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, delivered, pending
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1]
    elseif g[i] == 'last-delivered-id' then delivered = g[i + 1]
    elseif g[i] == 'pending' then pending = g[i + 1] end
  end
  if name ~= '__sl_bootstrap' then
    if (last and older(delivered, last[1])) or pending > 0 then
      return {'draining', name}
    end
  end
end
redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)
return {'retired', ''}
