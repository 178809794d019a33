-- Acknowledge the ids in group ARGV[1] of stream KEYS[1], then delete them per ARGV[2] (KEEPREF, DELREF,
-- ACKED): XACKDEL for servers older than 8.2. ARGV[3..]: the ids. Returns how many were acknowledged.
local key, group, mode = KEYS[1], ARGV[1], ARGV[2]
local ids = {}
for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
local function chunked(cmd, a, b)
  local n = 0
  for i = 1, #ids, 500 do
    local j = math.min(i + 499, #ids)
    if b then
      n = n + redis.call(cmd, a, b, unpack(ids, i, j))
    else
      n = n + redis.call(cmd, a, unpack(ids, i, j))
    end
  end
  return n
end
local acked = chunked('XACK', key, group)
local function field(list, name)
  for i = 1, #list, 2 do if list[i] == name then return list[i + 1] end end
end
local function older_or_equal(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, aseq, bms, bseq = tonumber(ams), tonumber(aseq), tonumber(bms), tonumber(bseq)
  return ams < bms or (ams == bms and aseq <= bseq)
end
if mode == 'KEEPREF' then
  chunked('XDEL', key)
elseif mode == 'DELREF' then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
    chunked('XACK', key, field(g, 'name'))
  end
  chunked('XDEL', key)
else
  local groups = redis.call('XINFO', 'GROUPS', key)
  for _, id in ipairs(ids) do
    local deletable = true
    for _, g in ipairs(groups) do
      local name = field(g, 'name')
      if not older_or_equal(id, field(g, 'last-delivered-id')) then deletable = false break end
      if #redis.call('XPENDING', key, name, id, id, 1) > 0 then deletable = false break end
    end
    if deletable then redis.call('XDEL', key, id) end
  end
end
return acked
