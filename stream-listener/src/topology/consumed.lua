-- Whether consumer groups of stream KEYS[1] consumed every entry with an id up to ARGV[3] (the largest id
-- below the bound ARGV[2] ms): Redis time has reached the bound (so no new entry can get an id below it),
-- the group's last-delivered-id is at or past the last such entry, and none of them is pending. ARGV[1]
-- names the group, or is empty for every group. Returns {consumed 0|1, now ms, blocking group}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nows = string.format('%d', now)
if now < tonumber(ARGV[2]) then
  return {0, nows, ''}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {1, nows, ''}
end
local last = redis.call('XREVRANGE', KEYS[1], ARGV[3], '-', 'COUNT', 1)[1]
local function older(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, aseq, bms, bseq = tonumber(ams), tonumber(aseq), tonumber(bms), tonumber(bseq)
  return ams < bms or (ams == bms and aseq < bseq)
end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, delivered
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then delivered = g[i + 1] end
  end
  if name ~= '__sl_bootstrap' and (ARGV[1] == '' or ARGV[1] == name) then
    if last and older(delivered, last[1]) then
      return {0, nows, name}
    end
    if #redis.call('XPENDING', KEYS[1], name, '-', ARGV[3], 1) > 0 then
      return {0, nows, name}
    end
  end
end
return {1, nows, ''}
