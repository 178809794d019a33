-- Moves a group's last delivered id on one shard stream and keeps its lag known (Redis >= 7):
-- XGROUP SETID with ENTRIESREAD = entries added - entries after the new position, in one call so no
-- producer can add an entry between the count and the move.
-- KEYS: the shard stream. ARGV: group, position (an id, '0' or '$'), the most entries to count.
-- Reply: the entries-read set; -1 on a server without entries-added (before Redis 7: plain SETID);
-- -2 when more than the limit follow the position (plain SETID; Redis then reports no lag).
local function field(flat, name)
  for i = 1, #flat, 2 do
    if flat[i] == name then return flat[i + 1] end
  end
  return nil
end
local added = field(redis.call('XINFO', 'STREAM', KEYS[1]), 'entries-added')
if type(added) ~= 'number' then
  redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], ARGV[2])
  return -1
end
local after = 0
if ARGV[2] ~= '$' then
  local limit = tonumber(ARGV[3])
  local from = '(' .. ARGV[2]
  while true do
    local ok, batch = pcall(redis.call, 'XRANGE', KEYS[1], from, '+', 'COUNT', 1000)
    if not ok then break end
    after = after + #batch
    if after > limit then
      redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], ARGV[2])
      return -2
    end
    if #batch < 1000 then break end
    from = '(' .. batch[#batch][1]
  end
end
local read = added - after
redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], ARGV[2], 'ENTRIESREAD', read)
return read
