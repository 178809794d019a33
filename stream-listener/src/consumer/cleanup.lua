-- Delete the consumers of group ARGV[1] on stream KEYS[1] other than ARGV[2] that have nothing pending,
-- while this ownership's fence KEYS[2] exists (see fence.rs). Returns the deleted names.
local deleted = {}
if redis.call('EXISTS', KEYS[2]) == 0 then return deleted end
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local name, pending
  for i = 1, #c, 2 do
    if c[i] == 'name' then name = c[i + 1] elseif c[i] == 'pending' then pending = c[i + 1] end
  end
  if name ~= ARGV[2] and pending == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
    deleted[#deleted + 1] = name
  end
end
return deleted
