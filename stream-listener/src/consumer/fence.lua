-- Fences shard stream KEYS[1]'s fence for the member taking the shard: ARGV[1] is its member epoch, ARGV[2]
-- its fencing token ("<epoch> <member>"). Refused (0) when the fence holds a greater epoch (a later owner
-- took the shard); otherwise the token is written (1). Epochs are per member, so two owners in a row may
-- share an epoch value: an equal epoch is taken over.
local held = redis.call('GET', KEYS[1])
if held then
  local epoch = tonumber(string.match(held, '^(%-?%d+) '))
  if epoch and epoch > tonumber(ARGV[1]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
