-- Takes a queued heartbeat back out of the inbox (its sender failed and reports the error: nobody may
-- apply it later behind its back). KEYS: inbox. ARGV: reply id. Returns how many entries were removed.
local removed = 0
for _, entry in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local _, _, id = string.find(entry, '^%-?%d+ (%w+) ')
  if id == ARGV[1] then
    removed = removed + redis.call('LREM', KEYS[1], 1, entry)
  end
end
return removed
