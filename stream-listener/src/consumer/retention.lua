-- Retention of shard stream KEYS[1] (see retention.rs): trims what every consumer group of the stream has
-- acknowledged, keeping the newest ARGV[1] entries and those younger than ARGV[2] ms (0: no age limit),
-- removing at most ARGV[3] entries in this run; and counts the entries removed before a group read them.
-- Returns {trimmed, saturated (1: stopped at ARGV[3], more to trim), group, lost, group, lost, ...}.
-- (On Redis >= 8.2, `XTRIM ... ACKED` trims only what every group acknowledged, but it has no count bound
-- of its own and no loss detection; this script works from Redis 7.0.)
local key = KEYS[1]
local keep, keep_for_ms, max_trim = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('EXISTS', key) == 0 then return {0, 0} end
local function field(list, name)
  for i = 1, #list, 2 do if list[i] == name then return list[i + 1] end end
end
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function less(a, b)
  local ams, aseq = parse(a)
  local bms, bseq = parse(b)
  return ams < bms or (ams == bms and aseq < bseq)
end

local info = redis.call('XINFO', 'STREAM', key)
local length = field(info, 'length')
local added = field(info, 'entries-added') -- nil before Redis 7.0: no loss detection
local last_id = field(info, 'last-generated-id')
local first = field(info, 'first-entry')
local first_id = first and first[1]
local reply = {0, 0}
local floor
for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
  local name = field(g, 'name')
  local delivered = field(g, 'last-delivered-id')
  local read = field(g, 'entries-read') -- false when Redis cannot tell
  -- Loss: where the group's position is in the stream's count of entries ever added, when Redis can tell
  -- (caught up: all of them; behind the first entry: all but the ones still there), against the group's
  -- own count of entries read. What lies between was removed before the group read it. Setting the
  -- group's count to its position counts each loss once and mends the group's lag.
  if added and read then
    local position
    if length == 0 or delivered == last_id then
      position = added
    elseif first_id and less(delivered, first_id) then
      position = added - length
    end
    if position and position > read then
      redis.call('XGROUP', 'SETID', key, name, delivered, 'ENTRIESREAD', position)
      reply[#reply + 1] = name
      reply[#reply + 1] = position - read
    end
  end
  -- Floor: below the smallest pending id, or below the last-delivered id, the group acknowledged all.
  local pending = redis.call('XPENDING', key, name)
  local low = delivered
  if pending[1] > 0 then low = pending[2] end
  if floor == nil or less(low, floor) then floor = low end
end

if floor == nil or length <= keep then return reply end
local excess = length - keep
local limit = math.min(excess, max_trim)
local cut = floor
if keep_for_ms > 0 then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  if now_ms <= keep_for_ms then return reply end
  local young = string.format('%d-0', now_ms - keep_for_ms)
  if less(young, cut) then cut = young end
end
-- Whole nodes of the stream below the cut first: Redis frees them without reading an entry, so a run
-- on a busy shard costs O(nodes), not O(entries).
local trimmed = redis.call('XTRIM', key, 'MINID', '~', cut, 'LIMIT', limit)
-- Then exactly what is left below the cut (less than a node, unless the bound stopped the first step),
-- within what is left of the bound: only entries below the cut are read.
local rest = limit - trimmed
local bounded
if rest > 0 then
  local below = redis.call('XRANGE', key, '-', '(' .. cut, 'COUNT', rest + 1)
  bounded = #below > rest
  if bounded then cut = below[rest + 1][1] end
  if #below > 0 then trimmed = trimmed + redis.call('XTRIM', key, 'MINID', cut) end
else
  local first = redis.call('XRANGE', key, '-', '(' .. cut, 'COUNT', 1)
  bounded = #first > 0
end
reply[1] = trimmed
if bounded and excess > max_trim then reply[2] = 1 end
return reply
