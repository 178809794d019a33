-- Delete the consumers of group ARGV[1] on stream KEYS[1] other than ARGV[2] that have nothing pending.
-- Returns the deleted names.
local deleted = {}
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
